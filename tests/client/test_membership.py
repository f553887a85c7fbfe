"""The member's side of the group protocol, pure (no gateway): what it reports, what it
must apply, and the races between its heartbeat thread and its consuming thread."""

from __future__ import annotations

from gateway.client._consuming import Membership, Positions
from gateway.client._types import TableRef
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb


def _member() -> Membership:
    return Membership(
        "g", TableRef("ns", "t"), session_timeout=2.0, heartbeat_interval=0.2, client_id="me"
    )


def _answer(m: Membership, generation: int, assigned: list[int], pending: int = 0) -> None:
    asked = m.request()
    m.answer(
        pb.GroupHeartbeatResponse(
            member_id=m.member_id, generation=generation, assigned=assigned, pending=pending
        ),
        asked,
    )


def test_a_partition_taken_back_while_it_was_being_started_is_given_up() -> None:
    """Found by the benchmark: the consuming thread starts partitions 0..5 while the
    heartbeat thread hears that 3..5 go to a new member. The member must report holding
    all six (it reads them) until it gave 3..5 up, or the gateway hands them out twice."""
    m = _member()
    _answer(m, 1, [0, 1, 2, 3, 4, 5])
    plan = m.rebalance()
    assert plan.added == {0, 1, 2, 3, 4, 5}
    _answer(m, 2, [0, 1, 2])  # meanwhile, on the heartbeat thread
    m.took(plan.added)
    assert list(m.request().owned) == [0, 1, 2, 3, 4, 5]
    again = m.rebalance()
    assert (again.revoked, again.added, again.lost) == ({3, 4, 5}, set(), set())
    m.released(again.revoked)
    assert list(m.request().owned) == [0, 1, 2] and m.settled()


def test_a_fenced_member_loses_everything_once_and_rejoins() -> None:
    m = _member()
    _answer(m, 3, [0, 1])
    m.took(m.rebalance().added)
    m.fenced()
    asked = m.request()
    assert (asked.generation, list(asked.owned)) == (0, [0, 1])
    plan = m.rebalance()
    assert plan.lost == {0, 1} and not plan.revoked and not plan.added
    assert not m.rebalance() and list(m.request().owned) == []
    # An answer to a heartbeat sent before the fencing is not taken.
    stale = pb.GroupHeartbeatRequest(generation=3)
    m.answer(pb.GroupHeartbeatResponse(generation=3, assigned=[0, 1]), stale)
    assert m.generation == 0 and not m.settled()


def test_heartbeats_come_quickly_while_something_is_to_be_said() -> None:
    m = _member()
    _answer(m, 1, [0], pending=1)
    assert m.interval() < 0.2  # waiting for a partition
    _answer(m, 1, [0])
    assert m.interval() < 0.2  # holds less than it was given: will say so
    m.took([0])
    assert m.interval() == 0.2 and m.settled()


def test_positions_hand_out_and_commit_only_what_is_held() -> None:
    import pyarrow as pa

    pos = Positions("earliest")
    pos.positions.update({0: 5, 1: 0})
    pos.consumed.update({0: 5, 1: 0})
    batch = pa.record_batch({"_partition": pa.array([2, 2], pa.int32()), "_offset": [7, 8]})
    pos.hand_out([batch])  # partition 2 is not held (given up meanwhile): not consumed
    assert 2 not in pos.consumed
    assert pos.to_commit(None) == {0: 5, 1: 0}
    pos.committed_ok({0: 5})
    assert pos.to_commit(None) == {1: 0}
    assert pos.to_commit(None, only={0}) == {}
    pos.remove([1])
    assert pos.partitions == [0] and pos.to_commit(None) == {}
