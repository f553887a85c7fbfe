"""The Kafka cluster the gateway replicas form over a shared metadata store.

Each replica is a broker: it registers its node id and advertised address in the store
under a lease it renews every third of ``kafka.replica_lease_s`` (and removes when it
stops), and reads the live replicas back at each renewal. Metadata lists them; each
partition's leader is chosen among them by rendezvous hashing of the table and partition,
so clients spread their requests (any replica still serves any partition: the hot tier is
shared); each group's coordinator likewise, by rendezvous hashing of the tenant and group,
so every member of a group meets on one replica, where its membership lives. A replica
that dies drops out when its lease runs out, and its groups move to the survivors.

A gateway over SQLite (``kafka.cluster=auto``), or with ``kafka.cluster=off``, is a
cluster of one: node 0, every partition's leader and every group's coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.core import Replica

__all__ = ["Broker", "Cluster", "ReplicaRegistry", "node_id_of", "rendezvous"]

log = logging.getLogger("tidegate.server.kafka")


@dataclass(frozen=True, slots=True)
class Broker:
    """A gateway replica as Kafka clients are told to reach it."""

    host: str
    port: int
    cluster_id: str = "tidegate"
    node_id: int = 0


class ReplicaRegistry(Protocol):
    """What the cluster needs of the core (``StreamTables``)."""

    async def renew_replica(
        self, replica_id: str, node_id: int, host: str, port: int, lease_s: float
    ) -> list[Replica]: ...

    async def drop_replica(self, replica_id: str) -> None: ...


def node_id_of(replica_id: str) -> int:
    """A replica's Kafka node id: 31 bits of the SHA-256 of its name, so the same name
    gets the same id at every start (a non-negative int32, as Kafka's node ids are)."""
    digest = hashlib.sha256(replica_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFF_FFFF


def _score(node_id: int, key: str) -> tuple[int, int]:
    digest = hashlib.blake2b(f"{node_id}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big"), node_id


def rendezvous(key: str, brokers: Sequence[Broker]) -> Broker:
    """The broker of ``key`` among ``brokers`` (highest random weight): every replica
    that sees the same brokers picks the same one, and a broker leaving moves only its
    own keys."""
    return max(brokers, key=lambda b: _score(b.node_id, key))


class Cluster:
    """This replica and the live replicas it last read from the metadata store."""

    def __init__(
        self,
        me: Broker,
        *,
        registry: ReplicaRegistry | None = None,
        replica_id: str = "",
        lease_s: float = 10.0,
    ) -> None:
        #: Registered in the store (None: a cluster of one).
        self.registry = registry
        self.replica_id = replica_id or f"{me.host}:{me.port}"
        self.lease_s = lease_s
        if registry is not None:
            me = Broker(me.host, me.port, me.cluster_id, node_id_of(self.replica_id))
        self.me = me
        #: The live brokers by node id, this one always among them.
        self.brokers: tuple[Broker, ...] = (me,)
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    @property
    def controller_id(self) -> int:
        """The lowest live node id (any replica serves what clients send a controller)."""
        return self.brokers[0].node_id

    def leader(self, table_id: str, partition: int) -> Broker:
        """The partition's leader, as Metadata tells it."""
        return rendezvous(f"{table_id}/{partition}", self.brokers)

    def coordinator(self, tenant: str, group: str) -> Broker:
        """The replica that coordinates the tenant's group."""
        return rendezvous(f"{tenant}/{group}", self.brokers)

    def coordinates(self, tenant: str, group: str) -> bool:
        """Whether this replica coordinates the tenant's group (requests of the group
        reaching another are answered NOT_COORDINATOR)."""
        return self.coordinator(tenant, group).node_id == self.me.node_id

    async def start(self) -> None:
        """Register, read the live replicas, and keep renewing until :meth:`stop`."""
        if self.registry is None:
            return
        await self.renew()
        self._task = asyncio.create_task(self._renewing())

    async def stop(self) -> None:
        """Stop renewing and leave the cluster (the others see it gone at their next
        renewal, not a lease later)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.registry is not None:
            try:
                await self.registry.drop_replica(self.replica_id)
            except Exception as exc:  # its lease runs out instead
                log.warning("replica %s not removed from the cluster: %s", self.replica_id, exc)

    async def _renewing(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            await self.renew()

    async def renew(self) -> None:
        """Renew this replica's lease and read the live replicas; a failure keeps the
        brokers last read (logged once until it succeeds again)."""
        assert self.registry is not None
        me = self.me
        try:
            live = await self.registry.renew_replica(
                self.replica_id, me.node_id, me.host, me.port, self.lease_s
            )
        except Exception as exc:
            if not self._failing:
                log.error(
                    "Kafka replica %s (node %d) could not renew its registration in the "
                    "metadata store (another live replica may hold its node id: give each "
                    "replica its own kafka.replica_id): %s",
                    self.replica_id,
                    me.node_id,
                    exc,
                )
            self._failing = True
            return
        if self._failing:
            log.info("Kafka replica %s renewed its registration again", self.replica_id)
        self._failing = False
        brokers = {r.node_id: Broker(r.host, r.port, me.cluster_id, r.node_id) for r in live}
        brokers[me.node_id] = me
        self.brokers = tuple(brokers[n] for n in sorted(brokers))
