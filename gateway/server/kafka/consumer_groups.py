"""Kafka's consumer group protocol (KIP-848: ``ConsumerGroupHeartbeat``) as its
coordinator runs it, in this gateway process.

The assignment is the coordinator's (server-side, as the gateway's own groups assign):
per topic, the members subscribed to it share its partitions with the core's sticky
assignor (:func:`gateway.core.coordinator.sticky_assign`), each keeping what it has up
to its fair share. Every change of membership, of a subscription or of a subscribed
topic's partitions raises the group epoch and computes a new target assignment.

Members reconcile towards their target as KIP-848 says, revoking before others receive:

- A member told to give partitions up is answered its assignment less those, at its old
  epoch; the partitions stay *revoking* (held by it) until a heartbeat of it reports the
  partitions it owns without them (its acknowledgement), or it leaves, or its session or
  rebalance timeout ends.
- Only a member with nothing left to revoke moves to the group epoch, and it is given the
  partitions of its target that no other member holds (assigned or revoking); the rest
  come with a later heartbeat, once their holder let them go.

So a partition is never held by two members at once. A member's heartbeat must carry its
epoch (or the one before, when the answer to it was lost and it owns nothing new);
another epoch is ``FENCED_MEMBER_EPOCH``, a member the group does not know
``UNKNOWN_MEMBER_ID``; either way the client drops its partitions and rejoins at epoch 0.

In process, as the classic groups are (docs/decisions/kafka.md says why): every member of
a group must reach the same gateway replica. Committed offsets are the core's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from gateway.core.coordinator import sticky_assign

__all__ = [
    "Beat",
    "ConsumerGroup",
    "ConsumerGroups",
    "ConsumerMember",
    "Reply",
    "Topic",
    "TopicPartitions",
]

#: Partitions per topic id.
TopicPartitions = dict[uuid.UUID, frozenset[int]]

#: Most members a consumer group holds (Kafka's ``group.consumer.max.size``).
MAX_MEMBERS = 1000
#: The heartbeat interval told to members while their group reconciles, so that a
#: rebalance takes a few round trips rather than a few heartbeat intervals.
RECONCILING_INTERVAL_MS = 200

EMPTY, RECONCILING, STABLE = "Empty", "Reconciling", "Stable"


@dataclass(frozen=True, slots=True)
class Topic:
    """A table a member subscribed to, as Kafka names it."""

    topic_id: uuid.UUID
    name: str
    partitions: int


@dataclass(frozen=True, slots=True)
class Beat:
    """What one ``ConsumerGroupHeartbeat`` says (None: unchanged since the last one)."""

    member_id: str
    epoch: int
    client_id: str = ""
    rebalance_timeout_ms: int = -1
    subscribed: tuple[str, ...] | None = None
    owned: TopicPartitions | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """The coordinator's answer: an error, or the member's epoch and what it may read."""

    error: ErrorCode
    message: str | None = None
    epoch: int = -1
    assignment: TopicPartitions | None = None
    reconciling: bool = False


def _merge(*parts: Mapping[uuid.UUID, Iterable[int]]) -> TopicPartitions:
    out: dict[uuid.UUID, set[int]] = {}
    for part in parts:
        for tid, ps in part.items():
            out.setdefault(tid, set()).update(ps)
    return {tid: frozenset(ps) for tid, ps in out.items() if ps}


def _minus(a: TopicPartitions, b: TopicPartitions) -> TopicPartitions:
    out = {tid: ps - b.get(tid, frozenset()) for tid, ps in a.items()}
    return {tid: ps for tid, ps in out.items() if ps}


def _and(a: TopicPartitions, b: TopicPartitions) -> TopicPartitions:
    out = {tid: ps & b.get(tid, frozenset()) for tid, ps in a.items()}
    return {tid: ps for tid, ps in out.items() if ps}


@dataclass(eq=False)
class ConsumerMember:
    member_id: str
    client_id: str
    rebalance_timeout_s: float
    subscribed: tuple[str, ...] = ()
    epoch: int = 0
    previous_epoch: int = -1
    seen: float = field(default_factory=time.monotonic)
    #: When it joined (epoch ms).
    joined_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    #: What the member was last told it may read.
    assigned: TopicPartitions = field(default_factory=dict)
    #: What it was told to give up and has not yet said it let go.
    revoking: TopicPartitions = field(default_factory=dict)
    #: Since when it has had something to revoke (its rebalance timeout runs from then).
    revoking_since: float | None = None

    def held(self) -> TopicPartitions:
        return _merge(self.assigned, self.revoking)


@dataclass(eq=False)
class ConsumerGroup:
    group_id: str
    session_timeout_s: float
    epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    #: The subscribed topics at the last target assignment, by id.
    topics: dict[uuid.UUID, Topic] = field(default_factory=dict)
    target: dict[str, TopicPartitions] = field(default_factory=dict)

    @property
    def state(self) -> str:
        if not self.members:
            return EMPTY
        return STABLE if self.settled() else RECONCILING

    def settled(self) -> bool:
        return all(
            not m.revoking and m.assigned == self.target.get(m.member_id, {})
            for m in self.members.values()
        )

    def expire(self, now: float) -> bool:
        """Drop the members whose session ended, or who did not let go of what they were
        told to revoke within their rebalance timeout; whether any was dropped. What they
        held is free at once: they are fenced from now on."""
        gone = [
            m
            for m in self.members.values()
            if now - m.seen > self.session_timeout_s
            or (m.revoking_since is not None and now - m.revoking_since > m.rebalance_timeout_s)
        ]
        for m in gone:
            del self.members[m.member_id]
            self.target.pop(m.member_id, None)
        return bool(gone)

    def subscribed_names(self) -> set[str]:
        return {name for m in self.members.values() for name in m.subscribed}

    def reads(self, topic: str) -> bool:
        """Whether a member subscribed to ``topic``."""
        return any(topic in m.subscribed for m in self.members.values())

    # Target assignment ----------------------------------------------------------------
    def reassign(self, resolved: Mapping[str, Topic | None]) -> None:
        """A new group epoch and target: per topic, its subscribers share its partitions,
        each keeping what its previous target gave it up to its share."""
        self.epoch += 1
        topics = self._subscribed_topics(resolved)
        self.topics = topics
        target: dict[str, dict[uuid.UUID, frozenset[int]]] = {m: {} for m in self.members}
        for tid, topic in sorted(topics.items(), key=lambda kv: kv[1].name):
            readers = [mid for mid, m in self.members.items() if topic.name in set(m.subscribed)]
            current = {mid: self.target.get(mid, {}).get(tid, frozenset()) for mid in readers}
            for mid, ps in sticky_assign(topic.partitions, current, readers).items():
                if ps:
                    target[mid][tid] = frozenset(ps)
        self.target = target

    def _subscribed_topics(self, resolved: Mapping[str, Topic | None]) -> dict[uuid.UUID, Topic]:
        """The topics some member subscribes to, as ``resolved`` finds them."""
        found = (resolved.get(name) for name in sorted(self.subscribed_names()))
        return {t.topic_id: t for t in found if t is not None}

    def _topics_changed(self, resolved: Mapping[str, Topic | None]) -> bool:
        return self._subscribed_topics(resolved) != self.topics

    # One heartbeat --------------------------------------------------------------------
    def heartbeat(self, beat: Beat, resolved: Mapping[str, Topic | None], now: float) -> Reply:
        """Apply one heartbeat (a join at epoch 0, a heartbeat, a leave at epoch -1 or
        -2). ``resolved``: every topic name a member subscribes to (this one's new
        subscription included), as the tenant's tables are now; None where there is none."""
        changed = self.expire(now)
        member = self.members.get(beat.member_id)
        if beat.epoch < 0:
            if member is None:
                return self._unknown(beat.member_id, resolved, changed)
            del self.members[beat.member_id]
            self.target.pop(beat.member_id, None)
            self._maybe_reassign(resolved, True)
            return Reply(ErrorCode.none, epoch=beat.epoch)
        if beat.epoch == 0:
            if member is None:
                if len(self.members) >= MAX_MEMBERS:
                    self._maybe_reassign(resolved, changed)
                    return Reply(
                        ErrorCode.group_max_size_reached,
                        f"consumer group {self.group_id!r} has {MAX_MEMBERS} members, the "
                        "most a group may have",
                    )
                member = ConsumerMember(beat.member_id, beat.client_id, 0.0)
                self.members[beat.member_id] = member
                changed = True
            # A (re)join: whatever it held before is lost (a fenced member drops it).
            member.assigned, member.revoking, member.revoking_since = {}, {}, None
        elif member is None:
            return self._unknown(beat.member_id, resolved, changed)
        elif beat.epoch != member.epoch and not (
            beat.epoch == member.previous_epoch
            and (beat.owned is None or not _minus(beat.owned, member.held()))
        ):
            self._maybe_reassign(resolved, changed)
            return Reply(
                ErrorCode.fenced_member_epoch,
                f"member {beat.member_id} of consumer group {self.group_id!r} sent epoch "
                f"{beat.epoch}, but its epoch is {member.epoch}: rejoin with epoch 0",
            )
        member.seen = now
        member.client_id = beat.client_id or member.client_id
        if beat.rebalance_timeout_ms >= 0:
            member.rebalance_timeout_s = beat.rebalance_timeout_ms / 1000
        if beat.subscribed is not None and beat.subscribed != member.subscribed:
            member.subscribed = beat.subscribed
            changed = True
        if beat.owned is not None and beat.epoch == member.epoch:
            # Its acknowledgement: what it was revoking and no longer owns is let go.
            member.revoking = _and(member.revoking, beat.owned)
        self._maybe_reassign(resolved, changed)
        return self._reconcile(member, now)

    def _unknown(
        self, member_id: str, resolved: Mapping[str, Topic | None], changed: bool
    ) -> Reply:
        self._maybe_reassign(resolved, changed)
        return Reply(
            ErrorCode.unknown_member_id,
            f"member {member_id} is not in consumer group {self.group_id!r} (it left, or "
            "sent no heartbeat within its session timeout): rejoin with epoch 0",
        )

    def _maybe_reassign(self, resolved: Mapping[str, Topic | None], changed: bool) -> None:
        if changed or self._topics_changed(resolved):
            self.reassign(resolved)

    def _reconcile(self, member: ConsumerMember, now: float) -> Reply:
        """The member's next step towards its target: give up first, then receive."""
        target = self.target.get(member.member_id, {})
        dropped = _minus(member.assigned, target)
        if dropped:
            member.revoking = _merge(member.revoking, dropped)
            member.assigned = _and(member.assigned, target)
        if member.revoking:
            # Revoking: its epoch stays until it says it let go.
            if member.revoking_since is None:
                member.revoking_since = now
            return Reply(
                ErrorCode.none, epoch=member.epoch, assignment=member.assigned, reconciling=True
            )
        member.revoking_since = None
        others = _merge(*(m.held() for m in self.members.values() if m is not member))
        member.assigned = _merge(member.assigned, _minus(target, others))
        if member.epoch != self.epoch:
            member.previous_epoch, member.epoch = member.epoch, self.epoch
        return Reply(
            ErrorCode.none,
            epoch=member.epoch,
            assignment=member.assigned,
            reconciling=not self.settled(),
        )

    def check_commit(self, member_id: str, epoch: int, partitions: TopicPartitions) -> ErrorCode:
        """Whether a member may commit ``partitions`` at ``epoch``: it must be in the
        group, at its epoch, and hold them (assigned, or still revoking them)."""
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if epoch != member.epoch or _minus(partitions, member.held()):
            return ErrorCode.stale_member_epoch
        return ErrorCode.none


class ConsumerGroups:
    """Every consumer group of this gateway's Kafka listener, by tenant and group id."""

    def __init__(self, session_timeout_s: float, heartbeat_interval_ms: int) -> None:
        #: How long a member lives without a heartbeat, and how often it is told to
        #: send one (Kafka's group.consumer.session.timeout.ms and heartbeat.interval.ms).
        self.session_timeout_s = session_timeout_s
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._groups: dict[tuple[str, str], ConsumerGroup] = {}

    def find(self, tenant: str, group_id: str) -> ConsumerGroup | None:
        """The group, its expired members dropped; None when it has no member left (its
        committed offsets are the core's: nothing else of it is kept)."""
        group = self._groups.get((tenant, group_id))
        if group is None:
            return None
        if group.expire(time.monotonic()) and group.members:
            group.reassign({t.name: t for t in group.topics.values()})
        if not group.members:
            del self._groups[(tenant, group_id)]
            return None
        return group

    def get_or_create(self, tenant: str, group_id: str) -> ConsumerGroup:
        group = self.find(tenant, group_id)
        if group is None:
            self._forget_empty()
            group = self._groups[(tenant, group_id)] = ConsumerGroup(
                group_id, self.session_timeout_s
            )
        return group

    def forget_if_empty(self, tenant: str, group_id: str) -> None:
        group = self._groups.get((tenant, group_id))
        if group is not None and not group.members:
            del self._groups[(tenant, group_id)]

    def _forget_empty(self) -> None:
        """Drop the groups whose members all expired: the groups kept are bounded by the
        live members."""
        for tenant, group_id in list(self._groups):
            self.find(tenant, group_id)

    def every(self) -> list[tuple[str, ConsumerGroup]]:
        """``(tenant, group)`` of every group with members, by tenant and group id."""
        found = [(t, self.find(t, g)) for t, g in sorted(self._groups)]
        return [(t, g) for t, g in found if g is not None]

    def of_tenant(self, tenant: str) -> list[ConsumerGroup]:
        found = [self.find(t, g) for t, g in sorted(self._groups) if t == tenant]
        return [g for g in found if g is not None]
