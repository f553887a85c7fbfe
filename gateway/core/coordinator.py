"""The consumer-group coordinator: what a heartbeat, a leave, a session timeout and a
member's commit do to a group's membership on a table.

Pure: it changes the :class:`~gateway.meta.GroupState` it is handed (loaded, locked and
saved by the metadata store in one transaction, so gateway replicas coordinate through
the store) and decides with the time it is told. The protocol is Kafka's next-generation
one (KIP-848) in small:

- A member names itself (the SDK draws a random id) and joins with generation 0; after
  that every heartbeat says which partitions it holds. A leave, or no heartbeat within
  the member's session timeout, removes it.
- Every change of membership raises the group's generation and computes a new target
  assignment, sticky: each member keeps what it has up to its fair share, and only the
  surplus and the departed members' partitions move (:func:`sticky_assign`).
- Cooperative: a partition moves in two steps. Its holder is told to give it up; only
  once the holder's heartbeat says it no longer holds it (or its session timed out) is
  it given to its new member. No partition is ever held by two members.
- Each member has a generation: the group's generation when its assignment last changed;
  each partition remembers the generation at which the member got it. A commit must come
  from a member that still holds the partition, at or after that generation: a member
  fenced by a session timeout or a reassignment has its late commits refused
  (``ILLEGAL_GENERATION`` / ``UNKNOWN_MEMBER_ID``), as Kafka fences zombies.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from gateway.meta import GroupMember, GroupState
from gateway.wire.errors import GroupNotEmpty, IllegalGeneration, MemberFenced, UnknownMember

__all__ = [
    "Answer",
    "Changes",
    "Heartbeat",
    "check_commit",
    "expire",
    "heartbeat",
    "is_settled",
    "sticky_assign",
]


def sticky_assign(
    partitions: int, current: Mapping[str, Collection[int]], members: Sequence[str]
) -> dict[str, list[int]]:
    """Partitions ``0..partitions-1`` shared among ``members``, moving as few as possible
    from ``current`` (member -> what it has now; members not in ``members`` are gone).

    Every member gets ``partitions // len(members)`` or one more; the members holding the
    most get the extra ones, each keeps what it has up to its share (its lowest
    partitions), and the rest goes, lowest first, to the members below their share.
    Deterministic: the same inputs give the same answer on every gateway.
    """
    order = sorted(set(members))
    if not order:
        return {}
    kept: dict[str, list[int]] = {m: [] for m in order}
    taken: set[int] = set()
    for m in order:
        for p in sorted(current.get(m, ())):
            if 0 <= p < partitions and p not in taken:
                kept[m].append(p)
                taken.add(p)
    base, extra = divmod(partitions, len(order))
    ranked = sorted(order, key=lambda m: (-len(kept[m]), m))
    share = {m: base + (1 if i < extra else 0) for i, m in enumerate(ranked)}
    pool = sorted(set(range(partitions)) - taken)
    for m in order:
        surplus = kept[m][share[m] :]
        del kept[m][share[m] :]
        pool.extend(surplus)
    pool.sort(reverse=True)
    for m in order:
        while len(kept[m]) < share[m]:
            kept[m].append(pool.pop())
    return {m: sorted(ps) for m, ps in kept.items()}


@dataclass(frozen=True)
class Heartbeat:
    """What a member says: who it is, the generation it knows (0 to join), the partitions
    it holds now, its session timeout, and whether it leaves."""

    member_id: str
    generation: int
    owned: frozenset[int]
    session_timeout_ms: int
    client_id: str = ""
    leave: bool = False


@dataclass
class Changes:
    """What a call did to the group, for metrics: the membership changes it made (one
    reason each: ``join``, ``leave``, ``expire``) and, when it completed a rebalance,
    how long that took."""

    rebalances: list[str] = field(default_factory=list)
    settled_after_ms: int | None = None


@dataclass(frozen=True)
class Answer:
    """The coordinator's answer to a heartbeat: the member's generation and the
    partitions it may read now; ``pending`` of its target are still held by others, and
    ``settling`` says the group has not converged yet (heartbeat again soon). ``error``:
    the member is fenced (raised by the caller once the state is saved)."""

    member_id: str
    generation: int
    assigned: tuple[int, ...]
    pending: int
    settling: bool
    changes: Changes
    error: MemberFenced | None = None


def expire(state: GroupState, now_ms: int) -> list[str]:
    """Remove the members whose last heartbeat is older than their session timeout; their
    ids. Their partitions are free at once: they are fenced from now on."""
    gone = [
        mid for mid, m in sorted(state.members.items()) if now_ms - m.seen_ms > m.session_timeout_ms
    ]
    for mid in gone:
        del state.members[mid]
    return gone


def is_settled(state: GroupState) -> bool:
    """Every member holds exactly its target: nothing is waiting to be given or revoked."""
    return all(
        set(m.assigned) == set(m.target) and set(m.owned) <= set(m.target)
        for m in state.members.values()
    )


def _rebalance(state: GroupState, partitions: int, now_ms: int) -> None:
    """A new generation with a new target assignment, sticky to the current targets."""
    state.generation += 1
    targets = sticky_assign(
        partitions, {mid: m.target for mid, m in state.members.items()}, list(state.members)
    )
    for mid, m in state.members.items():
        m.target = targets[mid]
    state.rebalance_since_ms = None if is_settled(state) else now_ms


def _grant(state: GroupState, member: GroupMember) -> None:
    """Tell ``member`` what it may read now: its target, less what another member still
    holds (given to it, or not yet let go). A change gives it the group's generation."""
    others: set[int] = set()
    for m in state.members.values():
        if m is not member:
            others.update(m.held())
    granted = {
        p: member.assigned.get(p, state.generation)
        for p in member.target
        if p in member.assigned or p not in others
    }
    if set(granted) != set(member.assigned):
        member.generation = state.generation
    member.assigned = granted


def _settle(state: GroupState, changes: Changes, now_ms: int) -> None:
    """Note when the group has converged, and how long its rebalance took."""
    if state.rebalance_since_ms is not None and is_settled(state):
        changes.settled_after_ms = max(0, now_ms - state.rebalance_since_ms)
        state.rebalance_since_ms = None


def _finish(state: GroupState, changes: Changes, partitions: int, now_ms: int) -> None:
    """Rebalance after membership changes, and note when the group has converged."""
    if changes.rebalances:
        _rebalance(state, partitions, now_ms)
    _settle(state, changes, now_ms)


def heartbeat(
    state: GroupState, beat: Heartbeat, partitions: int, now_ms: int, *, group: str, table: str
) -> Answer:
    """Apply one heartbeat (a join, a heartbeat or a leave) of a member to the group."""
    changes = Changes(rebalances=["expire"] * len(expire(state, now_ms)))
    member = state.members.get(beat.member_id)
    if beat.leave:
        if member is not None:
            del state.members[beat.member_id]
            changes.rebalances.append("leave")
        _finish(state, changes, partitions, now_ms)
        return Answer(beat.member_id, state.generation, (), 0, False, changes)
    if member is None:
        if beat.generation > 0:
            _finish(state, changes, partitions, now_ms)
            return Answer(
                beat.member_id,
                state.generation,
                (),
                0,
                False,
                changes,
                unknown_member(state, beat.member_id, group, table),
            )
        member = GroupMember(
            member_id=beat.member_id,
            client_id=beat.client_id,
            generation=0,
            assigned={},
            owned={},
            target=[],
            session_timeout_ms=beat.session_timeout_ms,
            joined_ms=now_ms,
            seen_ms=now_ms,
        )
        state.members[beat.member_id] = member
        changes.rebalances.append("join")
    member.seen_ms = now_ms
    member.session_timeout_ms = beat.session_timeout_ms
    member.client_id = beat.client_id or member.client_id
    held = member.held()
    member.owned = {p: held[p] for p in sorted(beat.owned) if p in held}
    if changes.rebalances:
        _rebalance(state, partitions, now_ms)
    _grant(state, member)
    _settle(state, changes, now_ms)
    return Answer(
        member.member_id,
        member.generation,
        tuple(sorted(member.assigned)),
        len(set(member.target) - set(member.assigned)),
        state.rebalance_since_ms is not None,
        changes,
    )


def unknown_member(state: GroupState, member_id: str, group: str, table: str) -> UnknownMember:
    return UnknownMember(
        f"member {member_id} is not in consumer group {group!r} of {table} (it left, or "
        f"sent no heartbeat within its session timeout); the group is at generation "
        f"{state.generation}: rejoin, and consume from the group's committed offsets",
        group=group,
        member=member_id,
        generation=state.generation,
    )


def check_commit(
    state: GroupState,
    member_id: str,
    generation: int,
    committed: Collection[int],
    partitions: int,
    now_ms: int,
    *,
    group: str,
    table: str,
) -> tuple[MemberFenced | GroupNotEmpty | None, Changes]:
    """Whether a commit of ``committed`` partitions may be stored: None, or the refusal.

    A member (``member_id`` given) must be in the group and hold every partition it
    commits, at ``generation`` or a later one it was told; a commit from outside the group
    (no ``member_id``: ``tidegate group reset``, a consumer that assigns its own
    partitions) only while the group has no live member. Members whose session timed out
    are removed first (the changes are returned for metrics).
    """
    changes = Changes(rebalances=["expire"] * len(expire(state, now_ms)))
    _finish(state, changes, partitions, now_ms)
    if not member_id:
        if state.members:
            n = len(state.members)
            return (
                GroupNotEmpty(
                    f"consumer group {group!r} of {table} has {n} live member"
                    f"{'s' if n > 1 else ''}; offsets may be committed from outside the group "
                    "only while it has none (stop its consumers first, or commit as a member)",
                    group=group,
                    members=n,
                    generation=state.generation,
                ),
                changes,
            )
        return None, changes
    member = state.members.get(member_id)
    if member is None:
        return unknown_member(state, member_id, group, table), changes
    held = member.held()
    for p in sorted(committed):
        since = held.get(p)
        if since is None or not since <= generation <= member.generation:
            why = (
                "it does not hold that partition any more"
                if since is None
                else f"it holds that partition since generation {since}, at generation "
                f"{member.generation}"
            )
            return (
                IllegalGeneration(
                    f"commit refused: member {member_id} of consumer group {group!r} of "
                    f"{table} committed partition {p} at generation {generation}, but {why}; "
                    f"the group is at generation {state.generation}",
                    group=group,
                    member=member_id,
                    partition=p,
                    generation=state.generation,
                ),
                changes,
            )
    return None, changes
