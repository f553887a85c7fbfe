"""Kafka's classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) as its
coordinator runs it, in this gateway process.

The assignment is the client's own (range, round-robin, cooperative-sticky...): the
coordinator gathers the members, picks a protocol every member supports, names a leader,
hands the leader every member's metadata and hands each member the assignment the leader
sent back. It keeps, per tenant and group id, the members, the generation and the state
Kafka's coordinator keeps (Empty, PreparingRebalance, CompletingRebalance, Stable), and
answers a stale member as Kafka does (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
REBALANCE_IN_PROGRESS).

In process: every member of a classic group must reach the same gateway replica (the
Kafka listener tells clients one coordinator: the gateway they reached). The committed
offsets are the core's, shared by every replica.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

__all__ = ["ClassicGroup", "ClassicGroups", "Joined", "Member"]

#: How long a group that had no member waits for more members before its first
#: generation (Kafka's ``group.initial.rebalance.delay.ms`` is 3 s; shorter here).
INITIAL_DELAY_S = 0.5
#: How often a rebalance in progress checks whether every member rejoined.
_TICK_S = 0.05
#: How often a member waiting for the leader's assignment checks the leader is alive.
_SYNC_TICK_S = 1.0
#: Longest a member waits for a rebalance, whatever rebalance timeout it asks.
_MAX_REBALANCE_S = 60.0

EMPTY, PREPARING, COMPLETING, STABLE = (
    "Empty",
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
)


@dataclass(frozen=True, slots=True)
class Joined:
    """A JoinGroup's answer: the leader is given every member's metadata."""

    error: ErrorCode
    generation: int = -1
    protocol: str = ""
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, bytes], ...] = ()


@dataclass(eq=False)
class Member:
    member_id: str
    client_id: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocols: dict[str, bytes]
    seen: float = field(default_factory=time.monotonic)
    #: When it joined (epoch ms).
    joined_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    assignment: bytes = b""
    joining: asyncio.Future[Joined] | None = None
    syncing: asyncio.Future[tuple[ErrorCode, bytes]] | None = None


@dataclass(eq=False)
class ClassicGroup:
    group_id: str
    protocol_type: str = "consumer"
    state: str = EMPTY
    generation: int = 0
    leader: str = ""
    protocol: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    rebalance: asyncio.Task[None] | None = None

    # The state machine ------------------------------------------------------------
    def expire(self, now: float) -> bool:
        """Drop the members whose session timed out (a member waiting in a JoinGroup is
        not timed out); whether any was dropped."""
        gone = [
            m
            for m in self.members.values()
            if m.joining is None and now - m.seen > m.session_timeout_s
        ]
        for m in gone:
            self._drop(m)
        return bool(gone)

    def _drop(self, member: Member) -> None:
        del self.members[member.member_id]
        if member.joining is not None and not member.joining.done():
            member.joining.set_result(Joined(ErrorCode.unknown_member_id))
        if member.syncing is not None and not member.syncing.done():
            member.syncing.set_result((ErrorCode.unknown_member_id, b""))

    def prepare(self, delay: float = 0.0) -> None:
        """Start a rebalance: every member must rejoin (its next heartbeat tells it)."""
        if not self.members:
            self.state, self.leader, self.protocol = EMPTY, "", ""
            self.generation += 1
            return
        for m in self.members.values():
            if m.syncing is not None and not m.syncing.done():
                m.syncing.set_result((ErrorCode.rebalance_in_progress, b""))
            m.syncing = None
        self.state = PREPARING
        if self.rebalance is None or self.rebalance.done():
            self.rebalance = asyncio.get_running_loop().create_task(self._complete_join(delay))

    async def _complete_join(self, delay: float) -> None:
        await asyncio.sleep(delay)
        longest = max((m.rebalance_timeout_s for m in self.members.values()), default=0.0)
        deadline = time.monotonic() + min(longest, _MAX_REBALANCE_S)
        while self.state == PREPARING:
            now = time.monotonic()
            self.expire(now)
            waiting = [m for m in self.members.values() if m.joining is None]
            if waiting and now < deadline:
                await asyncio.sleep(_TICK_S)
                continue
            for m in waiting:  # never rejoined within the rebalance timeout
                self._drop(m)
            self._next_generation()

    def _next_generation(self) -> None:
        self.generation += 1
        if not self.members:
            self.state, self.leader, self.protocol = EMPTY, "", ""
            return
        if self.leader not in self.members:
            self.leader = next(iter(self.members))
        leader = self.members[self.leader]
        common = [
            name
            for name in leader.protocols
            if all(name in m.protocols for m in self.members.values())
        ]
        self.protocol = common[0] if common else next(iter(leader.protocols))
        self.state = COMPLETING
        everyone = tuple(
            (m.member_id, m.protocols.get(self.protocol, b"")) for m in self.members.values()
        )
        for m in self.members.values():
            m.seen = time.monotonic()
            m.assignment = b""
            joined = Joined(
                ErrorCode.none,
                self.generation,
                self.protocol,
                self.leader,
                m.member_id,
                everyone if m.member_id == self.leader else (),
            )
            if m.joining is not None and not m.joining.done():
                m.joining.set_result(joined)
            m.joining = None

    def sync(self, member: Member, assignments: dict[str, bytes]) -> None:
        """The leader's assignment: every member's share, handed to those waiting."""
        for m in self.members.values():
            m.assignment = assignments.get(m.member_id, b"")
            if m.syncing is not None and not m.syncing.done():
                m.syncing.set_result((ErrorCode.none, m.assignment))
            m.syncing = None
        self.state = STABLE

    def leave(self, member_id: str) -> bool:
        member = self.members.get(member_id)
        if member is None:
            return False
        self._drop(member)
        self.prepare()
        return True

    def check(self, member_id: str, generation: int) -> ErrorCode:
        """Whether a member at ``generation`` may heartbeat, sync or commit now."""
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if generation != self.generation:
            return ErrorCode.illegal_generation
        member.seen = time.monotonic()
        if self.state == PREPARING:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none


class ClassicGroups:
    """Every classic group of this gateway's Kafka listener, by tenant and group id."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str], ClassicGroup] = {}

    def find(self, tenant: str, group_id: str) -> ClassicGroup | None:
        group = self._groups.get((tenant, group_id))
        if group is not None and group.expire(time.monotonic()):
            group.prepare()
        return group

    def _forget_empty(self) -> None:
        """Drop the groups left without members (their committed offsets are the
        core's): the groups kept are bounded by the live members."""
        for key, group in list(self._groups.items()):
            if group.expire(time.monotonic()):
                group.prepare()
            if group.state == EMPTY and not group.members:
                del self._groups[key]

    def every(self) -> list[tuple[str, ClassicGroup]]:
        """``(tenant, group)`` of every group with members, by tenant and group id."""
        found = [(t, self.find(t, g)) for t, g in sorted(self._groups)]
        return [(t, g) for t, g in found if g is not None and g.members]

    def of_tenant(self, tenant: str) -> list[ClassicGroup]:
        return [
            g
            for (t, _), g in sorted(self._groups.items())
            if t == tenant and self.find(t, g.group_id)
        ]

    async def join(
        self,
        tenant: str,
        group_id: str,
        member_id: str,
        client_id: str,
        protocol_type: str,
        protocols: dict[str, bytes],
        session_timeout_s: float,
        rebalance_timeout_s: float,
    ) -> Joined:
        self._forget_empty()
        group = self.find(tenant, group_id)
        if group is None:
            group = self._groups[(tenant, group_id)] = ClassicGroup(group_id, protocol_type)
        if group.members and protocol_type != group.protocol_type:
            return Joined(ErrorCode.inconsistent_group_protocol)
        if group.members and not any(
            all(p in m.protocols for m in group.members.values()) for p in protocols
        ):
            return Joined(ErrorCode.inconsistent_group_protocol)
        member = group.members.get(member_id) if member_id else None
        if member_id and member is None:
            return Joined(ErrorCode.unknown_member_id)
        if member is None:
            member = Member(
                f"{client_id or 'member'}-{uuid.uuid4()}",
                client_id,
                session_timeout_s,
                rebalance_timeout_s,
                protocols,
            )
            group.members[member.member_id] = member
        member.protocols = protocols
        member.session_timeout_s = session_timeout_s
        member.rebalance_timeout_s = rebalance_timeout_s
        member.seen = time.monotonic()
        if member.joining is not None and not member.joining.done():
            member.joining.set_result(Joined(ErrorCode.unknown_member_id))
        waiter: asyncio.Future[Joined] = asyncio.get_running_loop().create_future()
        member.joining = waiter
        group.prepare(INITIAL_DELAY_S if group.state == EMPTY else 0.0)
        try:
            return await waiter
        except asyncio.CancelledError:
            # The connection went away mid-join: the member stays until its session ends.
            member.joining = None
            raise

    async def sync(
        self,
        tenant: str,
        group_id: str,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes],
    ) -> tuple[ErrorCode, bytes]:
        group = self.find(tenant, group_id)
        if group is None:
            return ErrorCode.unknown_member_id, b""
        code = group.check(member_id, generation)
        if code != ErrorCode.none:
            return code, b""
        member = group.members[member_id]
        if group.state == STABLE:
            return ErrorCode.none, member.assignment
        if member_id == group.leader:
            group.sync(member, assignments)
            return ErrorCode.none, member.assignment
        waiter: asyncio.Future[tuple[ErrorCode, bytes]] = asyncio.get_running_loop().create_future()
        member.syncing = waiter
        deadline = time.monotonic() + member.rebalance_timeout_s
        while time.monotonic() < deadline:
            try:
                return await asyncio.wait_for(asyncio.shield(waiter), _SYNC_TICK_S)
            except TimeoutError:
                # A leader that died before it synced times out here: the rebalance it
                # starts answers this member REBALANCE_IN_PROGRESS (it rejoins).
                self.find(tenant, group_id)
        return ErrorCode.rebalance_in_progress, b""
