"""The Kafka groups this replica coordinates, published to the metadata store so that
``tidegate group describe``, HTTP's and gRPC's group description and the console show
their members from any replica, as they show the SDK's (docs/kafka.md, "Groups in
tidegate group describe").

A classic or KIP-848 group's membership lives in the replica that coordinates it (its
heartbeats come every few hundred milliseconds: too often for the shared store). Once a
second this replica takes a snapshot of its groups (per group and table: the protocol, the
state, the generation or group epoch, and each member with the partitions of the table it
holds or is giving up) and writes it when it changed, or every third of the lease to
renew it. A replica that dies leaves rows that stop counting when their lease runs out;
one that stops clears its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Protocol

from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment
from kio.serial import entity_reader

from gateway.core import EdgeGroup, EdgeMember
from gateway.server.kafka.admin import subscribed_topics
from gateway.server.kafka.base import split_topic
from gateway.server.kafka.classic import ClassicGroup, ClassicGroups
from gateway.server.kafka.consumer_groups import ConsumerGroup, ConsumerGroups

__all__ = ["CLASSIC", "CONSUMER", "GroupPublisher", "assigned_partitions"]

log = logging.getLogger("tidegate.server.kafka")

#: The protocols as the group description names them.
CLASSIC, CONSUMER = "kafka-classic", "kafka-consumer"
#: How often the groups are looked at; the lease of what is published.
_EVERY_S, LEASE_S = 1.0, 15.0


class EdgeGroupStore(Protocol):
    """What the publisher needs of the core (``StreamTables``)."""

    async def publish_edge_groups(
        self, coordinator: str, groups: Sequence[EdgeGroup], lease_s: float
    ) -> None: ...


def assigned_partitions(assignment: bytes) -> dict[str, tuple[int, ...]]:
    """The partitions per topic a classic consumer's assignment (SyncGroup's bytes, the
    ``consumer`` protocol's) names; empty for bytes that are not one. Every version
    starts with the same array, so version 0's reader reads any."""
    if len(assignment) < 2 or struct.unpack_from(">h", assignment)[0] < 0:
        return {}
    try:
        read, _ = entity_reader(ConsumerProtocolAssignment)(assignment, 2)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # kio raises several kinds for bytes it cannot read
        return {}
    out: dict[str, set[int]] = {}
    for tp in read.assigned_partitions:
        out.setdefault(tp.topic, set()).update(int(p) for p in tp.partitions)
    return {t: tuple(sorted(ps)) for t, ps in out.items()}


def _wall_ms(monotonic: float) -> int:
    return int((time.time() - (time.monotonic() - monotonic)) * 1000)


class _Tables:
    """Members per table of one group, as they are gathered."""

    def __init__(self) -> None:
        self.members: dict[tuple[str, str], list[EdgeMember]] = {}

    def add(self, topic: str, member: EdgeMember) -> None:
        table = split_topic(topic)
        if table is not None:
            self.members.setdefault(table, []).append(member)

    def groups(
        self, tenant: str, group: str, protocol: str, state: str, generation: int
    ) -> Iterable[EdgeGroup]:
        for (ns, name), members in sorted(self.members.items()):
            yield EdgeGroup(tenant, group, ns, name, protocol, state, generation, tuple(members))


def classic_groups(tenant: str, group: ClassicGroup) -> Iterable[EdgeGroup]:
    """A classic group per table its members subscribe to or were assigned."""
    tables = _Tables()
    for m in group.members.values():
        held = assigned_partitions(m.assignment) if group.protocol_type == "consumer" else {}
        subscribed = subscribed_topics(m.protocols.get(group.protocol, b"")) or frozenset()
        for topic in sorted(set(held) | subscribed):
            member = EdgeMember(
                member_id=m.member_id,
                client_id=m.client_id,
                generation=group.generation,
                assigned=held.get(topic, ()),
                session_timeout_ms=int(m.session_timeout_s * 1000),
                joined_ms=m.joined_ms,
                seen_ms=_wall_ms(m.seen),
            )
            tables.add(topic, member)
    return tables.groups(tenant, group.group_id, CLASSIC, group.state, group.generation)


def consumer_groups(tenant: str, group: ConsumerGroup) -> Iterable[EdgeGroup]:
    """A KIP-848 group per table its members subscribe to."""
    tables = _Tables()
    names = {tid: t.name for tid, t in group.topics.items()}
    for m in group.members.values():
        assigned = {names.get(tid): ps for tid, ps in m.assigned.items()}
        revoking = {names.get(tid): ps for tid, ps in m.revoking.items()}
        for topic in sorted(set(m.subscribed) | {t for t in (*assigned, *revoking) if t}):
            member = EdgeMember(
                member_id=m.member_id,
                client_id=m.client_id,
                generation=m.epoch,
                assigned=tuple(sorted(assigned.get(topic, ()))),
                revoking=tuple(sorted(revoking.get(topic, ()))),
                session_timeout_ms=int(group.session_timeout_s * 1000),
                joined_ms=m.joined_ms,
                seen_ms=_wall_ms(m.seen),
            )
            tables.add(topic, member)
    return tables.groups(tenant, group.group_id, CONSUMER, group.state, group.epoch)


def _unchanged(groups: Sequence[EdgeGroup]) -> list[object]:
    """What tells two snapshots apart (members' last heartbeats left out: they change at
    every heartbeat, which would rewrite the rows every second)."""
    return [replace(g, members=tuple(replace(m, seen_ms=0) for m in g.members)) for g in groups]


class GroupPublisher:
    """Publishes this replica's Kafka groups (see the module docstring)."""

    def __init__(
        self,
        store: EdgeGroupStore,
        classic: ClassicGroups,
        consumer: ConsumerGroups,
        coordinates: Callable[[str, str], bool],
        coordinator: Callable[[], str],
    ) -> None:
        self.store, self.classic, self.consumer = store, classic, consumer
        self.coordinates, self.coordinator = coordinates, coordinator
        self._task: asyncio.Task[None] | None = None
        self._last: list[object] | None = None
        self._published_at = 0.0

    def snapshot(self) -> list[EdgeGroup]:
        """This replica's groups now, per table (those it no longer coordinates left out:
        their members are moving to the replica that does)."""
        out: list[EdgeGroup] = []
        for tenant, g in self.classic.every():
            if self.coordinates(tenant, g.group_id):
                out += classic_groups(tenant, g)
        for tenant, c in self.consumer.every():
            if self.coordinates(tenant, c.group_id):
                out += consumer_groups(tenant, c)
        return out

    async def publish(self, *, force: bool = False) -> None:
        """Write the snapshot when it changed, or to renew its lease."""
        groups = self.snapshot()
        key = _unchanged(groups)
        due = time.monotonic() - self._published_at >= LEASE_S / 3
        if not force and key == self._last and not (groups and due):
            return
        await self.store.publish_edge_groups(self.coordinator(), groups, LEASE_S)
        self._last, self._published_at = key, time.monotonic()

    def start(self) -> None:
        self._task = asyncio.create_task(self._publishing())

    async def stop(self) -> None:
        """Stop, and clear what this replica published (its groups end with it)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):  # else their lease runs out
            await self.store.publish_edge_groups(self.coordinator(), (), LEASE_S)

    async def _publishing(self) -> None:
        while True:
            await asyncio.sleep(_EVERY_S)
            try:
                await self.publish()
            except Exception as exc:  # the store is away: the next second tries again
                log.warning("the Kafka groups of this replica were not published: %s", exc)
                self._last = None
