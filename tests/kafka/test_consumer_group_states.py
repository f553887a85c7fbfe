"""The KIP-848 coordinator's state machine (gateway/server/kafka/consumer_groups.py) over
random histories of clients that join, heartbeat, lose answers, change subscriptions,
leave and die: no partition is ever held by two live clients, and once the survivors
keep heartbeating every subscribed partition is held by exactly one of them, shared
evenly. The clients are modelled as KIP-848 says a client behaves: it takes each answer's
assignment as what it holds (giving up what is gone first) and reports what it holds."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field

import pytest
from kio.schema.errors import ErrorCode

from gateway.server.kafka.consumer_groups import Beat, ConsumerGroup, Topic

TOPICS = {
    "a.one": Topic(uuid.UUID(int=1), "a.one", 5),
    "a.two": Topic(uuid.UUID(int=2), "a.two", 3),
}
BY_ID = {t.topic_id: t for t in TOPICS.values()}
SESSION_S = 10.0


@dataclass
class Client:
    member_id: str
    subscribed: tuple[str, ...]
    epoch: int = 0
    holds: set[tuple[uuid.UUID, int]] = field(default_factory=set)
    #: Subscription changed since the last answer: the next beat says it.
    tell: bool = True
    #: What its last answered beat reported holding: unchanged, a beat says nothing.
    reported: set[tuple[uuid.UUID, int]] | None = None

    def owned(self) -> dict[uuid.UUID, frozenset[int]]:
        out: dict[uuid.UUID, set[int]] = {}
        for tid, p in self.holds:
            out.setdefault(tid, set()).add(p)
        return {tid: frozenset(ps) for tid, ps in out.items()}


def _beat(group: ConsumerGroup, c: Client, now: float, *, lose: bool = False) -> None:
    reply = group.heartbeat(
        Beat(
            c.member_id,
            c.epoch,
            rebalance_timeout_ms=60_000,
            subscribed=c.subscribed if c.tell or c.epoch == 0 else None,
            owned=None if c.epoch and c.holds == c.reported else c.owned(),
        ),
        TOPICS,
        now,
    )
    if lose:
        return  # the answer never reached the client: it acts on nothing
    if reply.error != ErrorCode.none:
        assert reply.error in (ErrorCode.unknown_member_id, ErrorCode.fenced_member_epoch)
        c.holds.clear()  # lost: dropped without committing, and it rejoins
        c.epoch, c.reported = 0, None
        return
    c.tell = False
    c.reported = set(c.holds)
    c.epoch = reply.epoch
    assert reply.assignment is not None
    c.holds = {(tid, p) for tid, ps in reply.assignment.items() for p in ps}


def _no_partition_held_twice(clients: dict[str, Client]) -> None:
    seen: dict[tuple[uuid.UUID, int], str] = {}
    for c in clients.values():
        for tp in c.holds:
            assert tp not in seen, f"{tp} held by {seen[tp]} and {c.member_id}"
            seen[tp] = c.member_id


@pytest.mark.parametrize("seed", range(60))
def test_random_histories_never_hold_a_partition_twice_and_converge(seed: int) -> None:
    rnd = random.Random(seed)
    group = ConsumerGroup("g", SESSION_S)
    clients: dict[str, Client] = {}
    now = 0.0
    names = list(TOPICS)
    for step in range(80):
        now += 0.1
        roll = rnd.random()
        if roll < 0.15 or not clients:
            mid = f"m{step}"
            subs = tuple(sorted(rnd.sample(names, rnd.randint(1, len(names)))))
            clients[mid] = Client(mid, subs)
            _beat(group, clients[mid], now)
        elif roll < 0.22:
            # Killed: its process is gone; its session ends later.
            c = clients.pop(rnd.choice(sorted(clients)))
            if c.member_id in group.members:
                group.members[c.member_id].seen = now - SESSION_S - 1
        elif roll < 0.27:
            c = clients.pop(rnd.choice(sorted(clients)))
            c.holds.clear()
            group.heartbeat(Beat(c.member_id, -1), TOPICS, now)
        elif roll < 0.32:
            c = clients[rnd.choice(sorted(clients))]
            c.subscribed = tuple(sorted(rnd.sample(names, rnd.randint(1, len(names)))))
            c.tell = True
            _beat(group, c, now)
        else:
            c = clients[rnd.choice(sorted(clients))]
            _beat(group, c, now, lose=rnd.random() < 0.1)
        _no_partition_held_twice(clients)
        for c in clients.values():  # the live ones heartbeat within their session
            if c.member_id in group.members and now - group.members[c.member_id].seen > 5:
                _beat(group, c, now)
                _no_partition_held_twice(clients)
    # The survivors heartbeat until the group settles.
    for _ in range(10):
        now += 0.1
        for c in list(clients.values()):
            _beat(group, c, now)
            _no_partition_held_twice(clients)
    assert group.settled()
    for topic in TOPICS.values():
        readers = [c for c in clients.values() if topic.name in c.subscribed]
        held = sorted(p for c in readers for tid, p in c.holds if tid == topic.topic_id)
        assert held == (list(range(topic.partitions)) if readers else [])
        counts = [sum(1 for tid, _ in c.holds if tid == topic.topic_id) for c in readers]
        assert not counts or max(counts) - min(counts) <= 1
    epochs = {c.epoch for c in clients.values()}
    assert epochs <= {group.epoch}


def test_a_member_that_does_not_let_go_within_its_rebalance_timeout_is_dropped() -> None:
    group = ConsumerGroup("g", SESSION_S)
    one = TOPICS["a.one"]
    a = group.heartbeat(
        Beat("a", 0, rebalance_timeout_ms=2_000, subscribed=("a.one",), owned={}), TOPICS, 0.0
    )
    assert a.assignment == {one.topic_id: frozenset(range(5))}
    b = group.heartbeat(
        Beat("b", 0, rebalance_timeout_ms=2_000, subscribed=("a.one",)), TOPICS, 0.1
    )
    assert b.assignment == {}  # a still holds all of it
    told = group.heartbeat(Beat("a", a.epoch, owned=a.assignment), TOPICS, 0.2)
    assert told.assignment == {one.topic_id: frozenset({0, 1, 2})}  # give 3 and 4 up
    # a heartbeats on but never says it let 3 and 4 go: it keeps them, b waits...
    still = group.heartbeat(Beat("a", a.epoch), TOPICS, 1.5)
    assert still.error == ErrorCode.none
    assert group.heartbeat(Beat("b", b.epoch), TOPICS, 1.6).assignment == {}
    # ...until a's rebalance timeout ends: a is dropped, fenced, and b takes everything.
    late = group.heartbeat(Beat("b", b.epoch), TOPICS, 2.5)
    assert late.assignment == {one.topic_id: frozenset(range(5))}
    assert group.heartbeat(Beat("a", a.epoch), TOPICS, 2.6).error == ErrorCode.unknown_member_id


def test_a_fenced_member_keeps_what_it_held_until_it_rejoins() -> None:
    group = ConsumerGroup("g", SESSION_S)
    one = TOPICS["a.one"]
    a = group.heartbeat(
        Beat("a", 0, rebalance_timeout_ms=60_000, subscribed=("a.one",), owned={}), TOPICS, 0.0
    )
    fenced = group.heartbeat(Beat("a", a.epoch + 5), TOPICS, 0.1)
    assert fenced.error == ErrorCode.fenced_member_epoch
    b = group.heartbeat(
        Beat("b", 0, rebalance_timeout_ms=60_000, subscribed=("a.one",)), TOPICS, 0.2
    )
    assert b.assignment == {}  # a may still be reading all of it
    again = group.heartbeat(
        Beat("a", 0, rebalance_timeout_ms=60_000, subscribed=("a.one",), owned={}), TOPICS, 0.3
    )
    assert again.assignment == {one.topic_id: frozenset({0, 1, 2})}
    got = group.heartbeat(Beat("b", b.epoch), TOPICS, 0.4)
    assert got.assignment == {one.topic_id: frozenset({3, 4})}
