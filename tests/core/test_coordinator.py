"""The consumer-group coordinator, pure: assignment, cooperative moves, fencing."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.coordinator import (
    Answer,
    Heartbeat,
    check_commit,
    heartbeat,
    is_settled,
    sticky_assign,
)
from gateway.meta import GroupState
from gateway.wire.errors import GroupNotEmpty, IllegalGeneration, UnknownMember

SESSION_MS = 1_000


class Sim:
    """Members that do what a well-behaved SDK consumer does: hold what they are told,
    give up what they are told to give up, and say so at their next heartbeat."""

    def __init__(self, partitions: int) -> None:
        self.state = GroupState()
        self.partitions = partitions
        self.now = 1_000_000
        self.owned: dict[str, set[int]] = {}
        self.generation: dict[str, int] = {}

    def beat(self, member: str, *, leave: bool = False) -> Answer:
        answer = heartbeat(
            self.state,
            Heartbeat(
                member,
                self.generation.get(member, 0),
                frozenset(self.owned.get(member, set())),
                SESSION_MS,
                client_id=f"host/{member}",
                leave=leave,
            ),
            self.partitions,
            self.now,
            group="g",
            table="ns.t",
        )
        if answer.error is None and not leave:
            self.owned[member] = set(answer.assigned)
            self.generation[member] = answer.generation
        else:
            self.owned.pop(member, None)
            self.generation.pop(member, None)
        return answer

    def round(self, members: list[str] | None = None) -> None:
        for m in sorted(self.owned if members is None else members):
            self.beat(m)

    def settle(self, rounds: int = 6) -> None:
        for _ in range(rounds):
            self.round()

    def holders(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for mid, m in self.state.members.items():
            for p in m.held():
                out.setdefault(p, []).append(mid)
        return out


# Assignment -------------------------------------------------------------------------
def test_sticky_assign_shares_evenly() -> None:
    got = sticky_assign(6, {}, ["a", "b", "c"])
    assert sorted(len(v) for v in got.values()) == [2, 2, 2]
    assert sorted(p for v in got.values() for p in v) == list(range(6))
    assert sticky_assign(2, {}, ["a", "b", "c"])["c"] == []
    assert sticky_assign(3, {}, []) == {}


def test_sticky_assign_moves_only_what_must_move() -> None:
    before = {"a": [0, 1, 2], "b": [3, 4, 5]}
    after = sticky_assign(6, before, ["a", "b", "c"])
    moved = sum(1 for m, ps in after.items() for p in ps if p not in before.get(m, []))
    assert moved == 2  # c takes one from each, a and b keep the rest
    assert set(after["a"]) <= {0, 1, 2} and set(after["b"]) <= {3, 4, 5}
    # A member leaves: only its partitions move.
    gone = sticky_assign(6, after, ["a", "c"])
    assert set(after["a"]) <= set(gone["a"]) and set(after["c"]) <= set(gone["c"])


@given(
    st.integers(1, 12),
    st.lists(st.sampled_from("abcdef"), min_size=1, max_size=6, unique=True),
    st.lists(st.sampled_from("abcdef"), min_size=1, max_size=6, unique=True),
)
def test_sticky_assign_is_balanced_and_sticky(n: int, first: list[str], second: list[str]) -> None:
    one = sticky_assign(n, {}, first)
    two = sticky_assign(n, one, second)
    for got, members in ((one, first), (two, second)):
        sizes = [len(got[m]) for m in members]
        assert max(sizes) - min(sizes) <= 1
        assert sorted(p for ps in got.values() for p in ps) == list(range(n))
    # Nobody who stays loses a partition unless it had more than its share.
    for m in set(first) & set(second):
        lost = set(one[m]) - set(two[m])
        assert not lost or len(one[m]) > len(two[m])


# Membership -------------------------------------------------------------------------
def test_first_member_gets_everything_at_generation_one() -> None:
    sim = Sim(4)
    answer = sim.beat("a")
    assert (answer.assigned, answer.generation, answer.pending) == ((0, 1, 2, 3), 1, 0)
    assert answer.changes.rebalances == ["join"]
    assert is_settled(sim.state)


def test_a_join_moves_partitions_in_two_steps() -> None:
    sim = Sim(4)
    sim.beat("a")
    joined = sim.beat("b")
    # b's share is still a's: nothing for b until a gives it up.
    assert (joined.assigned, joined.pending, joined.settling) == ((), 2, True)
    told = sim.beat("a")  # a learns its new assignment; still holds the rest
    assert told.assigned == (0, 1) and told.generation == 2
    assert sim.holders()[2] == ["a"]
    sim.beat("a")  # a says it let 2 and 3 go
    got = sim.beat("b")
    assert (got.assigned, got.pending, got.settling) == ((2, 3), 0, False)
    assert got.changes.settled_after_ms == 0


def test_no_partition_is_ever_held_twice_and_groups_converge() -> None:
    sim = Sim(6)
    for m in "abc":
        sim.beat(m)
        for p, holders in sim.holders().items():
            assert len(holders) == 1, (p, holders)
    sim.settle()
    assert is_settled(sim.state)
    assert sorted(len(ps) for ps in sim.owned.values()) == [2, 2, 2]


def test_a_member_whose_session_times_out_loses_its_partitions() -> None:
    sim = Sim(4)
    sim.beat("a")
    sim.beat("b")
    sim.settle()
    b_had = sim.owned["b"]
    sim.now += SESSION_MS * 3 // 5
    sim.beat("a")
    sim.now += SESSION_MS * 3 // 5
    answer = sim.beat("a")  # b is silent: expired, its partitions go to a
    assert answer.changes.rebalances == ["expire"]
    assert set(answer.assigned) == {0, 1, 2, 3} and b_had < set(answer.assigned)
    # b comes back with its old generation: fenced, told to rejoin.
    late = heartbeat(
        sim.state,
        Heartbeat("b", sim.generation["b"], frozenset(b_had), SESSION_MS),
        4,
        sim.now,
        group="g",
        table="ns.t",
    )
    assert isinstance(late.error, UnknownMember)
    assert "member b is not in consumer group 'g' of ns.t" in late.error.message
    assert late.error.details["generation"] == sim.state.generation


def test_a_leave_frees_partitions_at_once() -> None:
    sim = Sim(2)
    sim.beat("a")
    sim.beat("b")
    sim.settle()
    left = sim.beat("b", leave=True)
    assert left.changes.rebalances == ["leave"]
    assert sim.beat("a").assigned == (0, 1)


# Fencing ------------------------------------------------------------------------------
def _commit(sim: Sim, member: str, generation: int, parts: set[int]) -> object:
    refusal, _ = check_commit(
        sim.state, member, generation, parts, sim.partitions, sim.now, group="g", table="ns.t"
    )
    return refusal


def test_commits_are_fenced_by_generation_and_ownership() -> None:
    sim = Sim(4)
    sim.beat("a")
    gen_a = sim.generation["a"]
    assert _commit(sim, "a", gen_a, {0, 1, 2, 3}) is None
    sim.beat("b")
    sim.settle()
    # a gave 2 and 3 to b: its commit of 3 from the old generation is refused.
    refused = _commit(sim, "a", gen_a, {3})
    assert isinstance(refused, IllegalGeneration)
    assert refused.details == {
        "group": "g",
        "member": "a",
        "partition": 3,
        "generation": sim.state.generation,
    }
    assert "member a of consumer group 'g'" in refused.message
    assert f"the group is at generation {sim.state.generation}" in refused.message
    # What a still holds commits from its old generation or its new one.
    assert _commit(sim, "a", gen_a, {0, 1}) is None
    assert _commit(sim, "a", sim.generation["a"], {0, 1}) is None
    # b got 3 at a later generation: a commit claiming an older one is refused.
    assert isinstance(_commit(sim, "b", gen_a, {3}), IllegalGeneration)
    assert _commit(sim, "b", sim.generation["b"], {2, 3}) is None


def test_a_revoking_member_may_commit_until_it_lets_go() -> None:
    sim = Sim(2)
    sim.beat("a")
    sim.beat("b")
    told = heartbeat(
        sim.state,
        Heartbeat("a", sim.generation["a"], frozenset({0, 1}), SESSION_MS),
        2,
        sim.now,
        group="g",
        table="ns.t",
    )
    assert told.assigned == (0,)
    revoked = 1
    assert _commit(sim, "a", told.generation, {revoked}) is None  # its last offsets
    sim.generation["a"] = told.generation
    sim.owned["a"] = {0}
    sim.beat("a")  # let go
    assert isinstance(_commit(sim, "a", told.generation, {revoked}), IllegalGeneration)


def test_expired_members_cannot_commit_and_outsiders_wait_for_an_empty_group() -> None:
    sim = Sim(2)
    sim.beat("a")
    outsider = _commit(sim, "", 0, {0})
    assert isinstance(outsider, GroupNotEmpty)
    assert "has 1 live member;" in outsider.message
    sim.now += SESSION_MS + 1
    refused = _commit(sim, "a", sim.generation["a"], {0})
    assert isinstance(refused, UnknownMember)
    assert _commit(sim, "", 0, {0}) is None  # the group is empty now


@given(
    st.lists(
        st.tuples(st.sampled_from(["beat", "join", "leave", "die", "tick"]), st.integers(0, 4)),
        min_size=1,
        max_size=60,
    ),
    st.integers(1, 8),
)
def test_random_histories_keep_partitions_exclusive_and_converge(
    steps: list[tuple[str, int]], partitions: int
) -> None:
    sim = Sim(partitions)
    names = ["m0", "m1", "m2", "m3", "m4"]
    dead: set[str] = set()
    for action, k in steps:
        name = names[k]
        joins = action == "join" and name not in sim.owned and name not in dead
        if joins or (action == "beat" and name in sim.owned):
            sim.beat(name)
        elif action == "leave" and name in sim.owned:
            sim.beat(name, leave=True)
        elif action == "die" and name in sim.owned:
            dead.add(name)
            sim.owned.pop(name)
        elif action == "tick":
            sim.now += SESSION_MS // 3
        for p, holders in sim.holders().items():
            assert len(holders) == 1, (p, holders)
    # The live members heartbeat until the dead ones time out: the group converges
    # with every partition held by exactly one live member.
    sim.now += SESSION_MS + 1
    sim.settle(8)
    live = set(sim.owned)
    if live:  # (with no live member left, nobody comes to expire the dead: no need)
        assert is_settled(sim.state)
        assert set(sim.state.members) == live
        held = Counter(p for ps in sim.owned.values() for p in ps)
        assert sorted(held) == list(range(partitions)) and set(held.values()) == {1}


@pytest.mark.parametrize("n", [1, 3, 7])
def test_three_members_settle_within_a_few_rounds(n: int) -> None:
    sim = Sim(n)
    for m in "abc":
        sim.beat(m)
    sim.settle(3)
    assert is_settled(sim.state)
