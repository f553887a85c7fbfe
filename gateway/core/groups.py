"""Consumer groups: committed offsets per group, table and partition, and membership
(heartbeats, rebalancing and fencing, decided by :mod:`gateway.core.coordinator` inside
one metadata-store transaction, so members may talk to different gateway replicas)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from gateway import metrics
from gateway.core.base import CoreBase
from gateway.core.coordinator import Answer, Changes, Heartbeat, check_commit, heartbeat
from gateway.core.names import INT64_MAX, check_group, check_text
from gateway.core.views import GroupMemberView, GroupPartitionView, GroupView, TableView
from gateway.hot import PartitionId
from gateway.meta import EdgeGroup, EdgeMember, GroupState
from gateway.wire.errors import GroupNotEmpty, InvalidRequest, OffsetOutOfRange, TidegateError

__all__ = ["EdgeGroup", "EdgeMember", "GroupOps"]

#: Longest member id and client id a member may give.
_MAX_ID = 255


def _now_ms() -> int:
    # Wall-clock time: members of one group may talk to different gateway replicas, which
    # compare the times they store (keep replicas' clocks in sync, as NTP does).
    return int(time.time() * 1000)


def _record(changes: Changes, refused: TidegateError | None = None) -> None:
    metrics.record_group_changes(changes.rebalances, changes.settled_after_ms)
    if refused is not None:
        metrics.record_fenced(refused.reason)


def _where(table: TableView) -> str:
    return f"{table.definition.namespace}.{table.definition.name}"


class GroupOps(CoreBase):
    if TYPE_CHECKING:  # from TableOps, its sibling in StreamTables

        async def describe_table(self, tenant: str, namespace: str, name: str) -> TableView: ...

    async def commit_offsets(
        self,
        tenant: str,
        group: str,
        namespace: str,
        name: str,
        offsets: dict[int, int],
        *,
        member_id: str = "",
        generation: int = 0,
    ) -> None:
        """Store a group's committed offsets (partition -> next offset to consume).

        From a member (``member_id`` and the ``generation`` it knows), only for partitions
        it holds at that generation; without one, only while the group has no live member.

        Raises:
            TableNotFound, InvalidPartition, InvalidRequest: a bad group name or a
            negative offset.
            IllegalGeneration, UnknownMember: a fenced member.
            GroupNotEmpty: a commit from outside a group with live members.
            OffsetOutOfRange: an offset past the partition's high watermark (a group
            commits the next offset to consume, at most the high watermark: a commit
            past it would leave the group failing on every read until reset).
        """
        check_group(group)
        if member_id:
            check_text("member id", member_id, _MAX_ID)
        table = await self.table(tenant, namespace, name)
        for p, off in offsets.items():
            self._part(table, p)
            if isinstance(off, bool) or not isinstance(off, int) or not 0 <= off <= INT64_MAX:
                raise InvalidRequest(
                    f"offset {off!r:.40} of partition {p} must be from 0 to {INT64_MAX}",
                    partition=p,
                )
        d = table.definition
        now = _now_ms()
        changes = Changes()

        def check(state: GroupState) -> TidegateError | None:
            refused, seen = check_commit(
                state,
                member_id,
                generation,
                list(offsets),
                d.partitions,
                now,
                group=group,
                table=_where(table),
            )
            changes.rebalances[:] = seen.rebalances
            changes.settled_after_ms = seen.settled_after_ms
            # A fenced member hears that it is fenced, whatever it tried to commit.
            return refused or past_end()

        ends: dict[int, tuple[int, int]] = {}

        def past_end() -> OffsetOutOfRange | None:
            for p, off in sorted(offsets.items()):
                earliest, high = ends[p]
                if off > high:
                    return OffsetOutOfRange(
                        f"offset {off} of partition {p} is past its end: a group commits "
                        f"the next offset to consume, at most the high watermark {high}",
                        offset=off,
                        earliest=earliest,
                        latest=high,
                    )
            return None

        def commit() -> TidegateError | None:
            cached = {v.partition: v for v in self.meta.partitions(d.table_id)}
            for p in offsets:
                hot = self.hot.offsets(self._part(table, p))
                known = cached.get(p)
                high = max(hot.high, known.tiered_watermark if known is not None else 0)
                ends[p] = (known.earliest_offset if known is not None else 0, high)
            return self.meta.commit_offsets(tenant, group, d.table_id, dict(offsets), check)

        refused = await self._run(commit)
        _record(changes, refused)
        if refused is not None:
            raise refused

    async def fetch_offsets(
        self,
        tenant: str,
        group: str,
        namespace: str,
        name: str,
        partitions: Sequence[int] | None = None,
    ) -> dict[int, int]:
        """A group's committed offsets; partitions without a commit are absent.

        Raises:
            TableNotFound, InvalidPartition, InvalidRequest: a bad group name.
        """
        check_group(group)
        table = await self.table(tenant, namespace, name)
        wanted = set(self._partitions(table, partitions))
        got = await self._run(self.meta.fetch_offsets, tenant, group, table.definition.table_id)
        return {p: o for p, o in sorted(got.items()) if p in wanted}

    async def delete_offsets(
        self,
        tenant: str,
        group: str,
        namespace: str,
        name: str,
        partitions: Sequence[int],
    ) -> None:
        """Forget a group's committed offsets of ``partitions`` of the table (Kafka's
        OffsetDelete): the group then starts those partitions where a new group would.
        Partitions never committed are skipped. Refused while the group has a live member
        on the table, which reads from those offsets (members whose session timed out
        are removed first).

        Raises:
            TableNotFound, InvalidPartition, InvalidRequest: a bad group name.
            GroupNotEmpty: the group has live members on the table; nothing is deleted.
        """
        check_group(group)
        table = await self.table(tenant, namespace, name)
        for p in partitions:
            self._part(table, p)
        wanted = sorted(set(partitions))  # none named: none deleted (not "all")
        d = table.definition
        now = _now_ms()
        changes = Changes()

        def check(state: GroupState) -> TidegateError | None:
            _, seen = check_commit(
                state, "", 0, (), d.partitions, now, group=group, table=_where(table)
            )
            changes.rebalances[:] = seen.rebalances
            changes.settled_after_ms = seen.settled_after_ms
            if not state.members:
                return None
            n = len(state.members)
            return GroupNotEmpty(
                f"consumer group {group!r} has {n} live member{'s' if n > 1 else ''} on "
                f"{_where(table)}; its committed offsets there may be deleted only while it "
                "has none (stop its consumers first)",
                group=group,
                members=n,
                generation=state.generation,
            )

        refused = await self._run(
            self.meta.delete_offsets, tenant, group, d.table_id, wanted, check
        )
        _record(changes)
        if refused is not None:
            raise refused

    async def list_groups(
        self, tenant: str, namespace: str | None = None, name: str | None = None
    ) -> list[tuple[str, str, str]]:
        """``(group, namespace, table)`` for every group with committed offsets or
        members, of one table when ``namespace`` and ``name`` are given.

        Raises:
            TableNotFound: the table named does not exist.
        """
        table_id = None
        if namespace or name:
            table_id = (await self.table(tenant, namespace or "", name or "")).definition.table_id
        found = await self._run(self.meta.list_groups, tenant, table_id)
        names = {
            d.table_id: (d.namespace, d.name)
            for d in await self._run(self.meta.list_tables, tenant, None)
        }
        listed = {(group, *names[tid]) for group, tid in found if tid in names}
        tables = set(names.values()) if table_id is None else {names.get(table_id)}
        for g in await self._run(self.meta.edge_groups, tenant):
            if (g.namespace, g.name) in tables:
                listed.add((g.group, g.namespace, g.name))
        return sorted(listed)

    # Membership ---------------------------------------------------------------------
    async def group_heartbeat(
        self,
        tenant: str,
        group: str,
        namespace: str,
        name: str,
        *,
        member_id: str,
        generation: int,
        owned: Sequence[int],
        session_timeout_ms: int,
        client_id: str = "",
        leave: bool = False,
    ) -> Answer:
        """A member's heartbeat: join (``generation`` 0; an empty ``member_id`` gets one
        drawn here), stay (with the partitions it holds), or ``leave``. The answer says
        what it may read now, at which generation.

        Raises:
            TableNotFound, InvalidPartition, InvalidRequest: a bad name, partition,
            generation or session timeout.
            UnknownMember: a member the group no longer knows (rejoin with generation 0).
        """
        check_group(group)
        check_text("member id", member_id, _MAX_ID)
        check_text("client id", client_id, _MAX_ID)
        if not member_id:
            if generation or leave:
                raise InvalidRequest("a heartbeat needs the member id its join was answered")
            member_id = uuid.uuid4().hex
        if isinstance(generation, bool) or not 0 <= generation <= INT64_MAX:
            raise InvalidRequest(f"generation {generation!r:.40} must be from 0 to {INT64_MAX}")
        limits = self.settings.groups
        if not leave and not (
            limits.min_session_timeout_ms <= session_timeout_ms <= limits.max_session_timeout_ms
        ):
            raise InvalidRequest(
                f"session timeout {session_timeout_ms} ms is outside what this gateway "
                f"allows: {limits.min_session_timeout_ms} to {limits.max_session_timeout_ms} ms",
                minimum=limits.min_session_timeout_ms,
                maximum=limits.max_session_timeout_ms,
            )
        table = await self.table(tenant, namespace, name)
        for p in owned:
            self._part(table, p)
        beat = Heartbeat(
            member_id, generation, frozenset(owned), session_timeout_ms, client_id, leave
        )
        d = table.definition
        now = _now_ms()
        answer: Answer = await self._run(
            self.meta.update_group,
            tenant,
            group,
            d.table_id,
            lambda state: heartbeat(
                state, beat, d.partitions, now, group=group, table=_where(table)
            ),
        )
        _record(answer.changes, answer.error)
        if answer.error is not None:
            raise answer.error
        return answer

    async def describe_group(self, tenant: str, group: str, namespace: str, name: str) -> GroupView:
        """The group on the table: generation, members and what each holds, and per
        partition its member, committed offset and lag. Members whose session timed out
        are removed first (that starts a rebalance, as their next heartbeat would).

        Raises:
            TableNotFound, InvalidRequest: a bad group name.
        """
        check_group(group)
        view = await self.describe_table(tenant, namespace, name)
        d = view.definition
        now = _now_ms()
        state = await self._run(self.meta.read_group, tenant, group, d.table_id)
        if any(now - m.seen_ms > m.session_timeout_ms for m in state.members.values()):
            changes = Changes()

            def sweep(current: GroupState) -> GroupState:
                # A commit check from outside the group: it refuses nothing here, but
                # removes the expired members and rebalances, as a heartbeat would.
                _, seen = check_commit(
                    current, "", 0, (), d.partitions, now, group=group, table=_where(view)
                )
                changes.rebalances[:] = seen.rebalances
                changes.settled_after_ms = seen.settled_after_ms
                return current

            state = await self._run(self.meta.update_group, tenant, group, d.table_id, sweep)
            _record(changes)
        committed = await self._run(self.meta.fetch_offsets, tenant, group, d.table_id)
        holder = {p: m.member_id for m in state.members.values() for p in m.held()}
        members: tuple[GroupMemberView, ...] = tuple(
            GroupMemberView(
                member_id=m.member_id,
                client_id=m.client_id,
                generation=m.generation,
                assigned=tuple(sorted(m.assigned)),
                revoking=tuple(sorted(set(m.owned) - set(m.assigned))),
                pending=tuple(sorted(set(m.target) - set(m.assigned))),
                session_timeout_ms=m.session_timeout_ms,
                joined_ms=m.joined_ms,
                last_heartbeat_ms=m.seen_ms,
            )
            for m in sorted(state.members.values(), key=lambda m: (m.joined_ms, m.member_id))
        )
        parts = []
        for p in view.partitions:
            at = committed.get(p.partition)
            start = p.earliest_offset if at is None else at
            parts.append(
                GroupPartitionView(
                    p.partition,
                    holder.get(p.partition),
                    at,
                    p.high_watermark,
                    max(0, p.high_watermark - start),
                )
            )
        if not state.members:
            status = "empty"
        elif state.rebalance_since_ms is None:
            status = "stable"
        else:
            status = "rebalancing"
        generation = state.generation
        edge = await self._run(self.meta.edge_groups, tenant, group, d.namespace, d.name)
        for g in edge:
            # A group an edge coordinates (Kafka's): its members beside the SDK's.
            members += tuple(_edge_member(m, g.protocol) for m in g.members)
            held = {p: m.member_id for m in g.members for p in (*m.assigned, *m.revoking)}
            parts = [
                p if p.member_id else replace(p, member_id=held.get(p.partition)) for p in parts
            ]
            if not state.members:
                status, generation = _EDGE_STATES.get(g.state, "rebalancing"), g.generation
        return GroupView(group, d.namespace, d.name, generation, status, members, tuple(parts))

    async def publish_edge_groups(
        self, coordinator: str, groups: Sequence[EdgeGroup], lease_s: float
    ) -> None:
        """Publish the groups an edge's protocol coordinates in this replica (replacing
        what ``coordinator`` published before), live for ``lease_s`` seconds, so every
        replica's :meth:`describe_group` and :meth:`list_groups` show them."""
        await self._run(self.meta.publish_edge_groups, coordinator, groups, lease_s)

    def group_lags(self) -> tuple[list[tuple[str, str, str, int]], int]:
        """``(tenant, group, table, lag)`` of every group with commits, and the live
        members of all groups (blocking: the /metrics scrape hook). A partition's lag is
        its high watermark (the hot tier's) less the group's committed offset, 0 when
        never committed (``describe_group`` counts from the earliest offset instead)."""
        lags: list[tuple[str, str, str, int]] = []
        members = 0
        now = _now_ms()
        tables = {d.table_id: d for d in self.meta.all_tables()}
        highs: dict[str, list[int]] = {}  # per table, read once whatever its groups
        for tenant, group, table_id, committed, state in self.meta.all_groups():
            members += sum(
                1 for m in state.members.values() if now - m.seen_ms <= m.session_timeout_ms
            )
            d = tables.get(table_id)
            if d is None:
                continue
            if table_id not in highs:
                highs[table_id] = [
                    self.hot.offsets(PartitionId(d.tenant, d.table_id, p)).high
                    for p in range(d.partitions)
                ]
            lag = sum(max(0, high - committed.get(p, 0)) for p, high in enumerate(highs[table_id]))
            lags.append((tenant, group, f"{d.namespace}.{d.name}", lag))
        return lags, members


#: Edge protocols' group states as :class:`GroupView` names them (Kafka's classic states,
#: and KIP-848's).
_EDGE_STATES = {
    "Empty": "empty",
    "Stable": "stable",
    "PreparingRebalance": "rebalancing",
    "CompletingRebalance": "rebalancing",
    "Reconciling": "rebalancing",
    "Assigning": "rebalancing",
}


def _edge_member(m: EdgeMember, protocol: str) -> GroupMemberView:
    return GroupMemberView(
        member_id=m.member_id,
        client_id=m.client_id,
        generation=m.generation,
        assigned=m.assigned,
        revoking=m.revoking,
        pending=(),
        session_timeout_ms=m.session_timeout_ms,
        joined_ms=m.joined_ms,
        last_heartbeat_ms=m.seen_ms,
        protocol=protocol,
    )
