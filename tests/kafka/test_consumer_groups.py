"""Kafka's consumer group protocol (KIP-848, ``group.protocol=consumer``): the gateway
assigns, confluent-kafka consumers reconcile; a SIGKILLed member's partitions move to the
others from its committed offsets, which are the ones ``tidegate group describe`` shows.
Exact frames check the fencing, leaving, isolation and refusals."""

from __future__ import annotations

import datetime as dt
import json
import secrets
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema

from gateway.server.kafka.protocol import ErrorCode, build
from gateway.server.kafka.published import CONSUMER
from tests.integration.test_first_hour import cli
from tests.kafka.clients import librdkafka_settings
from tests.kafka.conftest import KafkaTarget
from tests.kafka.members import Member, described_holdings, holding, lines, until
from tests.kafka.raw import RawKafka
from tests.kafka.test_groups import PARTITIONS, _produce
from tests.services import GatewayProcess

pytestmark = pytest.mark.integration


HEARTBEAT, DESCRIBE = 68, 69


def test_a_consumer_protocol_group_of_three_reads_every_record_once_while_a_member_is_killed(
    kafka: KafkaTarget, members: list[Member], tmp_path: Path
) -> None:
    topic = f"c{secrets.token_hex(5)}.clicks"
    with kafka.gateway.client() as c:
        c.create_table(topic, {"id": "int64"}, partitions=PARTITIONS)
    group = f"kip848-{secrets.token_hex(4)}"
    settings = {
        **librdkafka_settings(kafka),
        "group.id": group,
        "group.protocol": "consumer",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    _produce(kafka, topic, 0, 10)
    members.extend(Member(tmp_path, n, settings, topic) for n in range(3))

    def read() -> list[tuple[int, int]]:
        return [r for m in members for r in m.read()]

    # The gateway gave each member two partitions, and all was read.
    until("the group to settle", lambda: all(len(m.assigned()) == 2 for m in members))
    assert sorted(p for m in members for p in m.assigned()) == list(range(PARTITIONS))
    until("the first records", lambda: len(read()) >= 10 * PARTITIONS)
    with RawKafka(kafka) as conn:
        conn.authenticate(kafka.tenant, kafka.key)
        described = conn.call(_request(DESCRIBE, 1, group_ids=[group])).groups[0]
    assert (described.error_code, described.group_state) == (ErrorCode.none, "Stable")
    assert len(described.members) == 3
    assert sorted(
        p for m in described.members for t in m.assignment.topic_partitions for p in t.partitions
    ) == list(range(PARTITIONS))
    victim = members[0]
    lost = victim.assigned()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    _produce(kafka, topic, 1000, 10)
    until("every record", lambda: len(read()) >= 20 * PARTITIONS)
    time.sleep(1)  # nothing more comes: no record is read twice
    got = read()
    assert sorted(got) == [(p, o) for p in range(PARTITIONS) for o in range(20)]
    # The survivors took over the killed member's partitions, from its committed offsets.
    survivors = {r for m in members[1:] for r in m.read()}
    assert {(p, o) for p in lost for o in range(10, 20)} <= survivors
    assert sorted(members[1].assigned() + members[2].assigned()) == list(range(PARTITIONS))
    # The group's description shows the Kafka members, each holding what its client holds.
    until(
        "the members described",
        lambda: described_holdings(kafka.gateway, group, topic, CONSUMER) == holding(members[1:]),
    )
    for m in members[1:]:
        m.stop()
    described_cli = json.loads(
        cli(kafka.gateway, "group", "describe", group, topic, "--json").stdout
    )
    committed = {p["partition"]: p["committed"] for p in described_cli["partitions"]}
    assert committed == dict.fromkeys(range(PARTITIONS), 20)
    with RawKafka(kafka) as conn:
        conn.authenticate(kafka.tenant, kafka.key)
        fetched = conn.call(
            _request(9, 7, group_id=group, topics=[{"name": topic, "partition_indexes": [0, 5]}])
        )
    assert [p.committed_offset for p in fetched.topics[0].partitions] == [20, 20]


def test_a_consumer_protocol_group_rejoins_after_the_gateway_is_killed(
    killable: GatewayProcess, members: list[Member], tmp_path: Path
) -> None:
    """The group lives in the gateway process: killed and started again, it knows no
    member, and the members rejoin (UNKNOWN_MEMBER_ID) and go on from their commits."""
    gw = killable
    assert gw.api_key is not None
    target = KafkaTarget(gw, f"127.0.0.1:{gw.kafka_port}", gw.tenant, gw.api_key)
    topic = f"r{secrets.token_hex(5)}.clicks"
    with gw.client() as c:
        c.create_table(topic, {"id": "int64"}, partitions=PARTITIONS)
    group = f"restart-{secrets.token_hex(4)}"
    settings = {
        **librdkafka_settings(target),
        "group.id": group,
        "group.protocol": "consumer",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    _produce(target, topic, 0, 10)
    members.extend(Member(tmp_path, n, settings, topic) for n in range(2))

    def read() -> list[tuple[int, int]]:
        return [r for m in members for r in m.read()]

    until("the group to settle", lambda: all(len(m.assigned()) == 3 for m in members))
    until("the first records", lambda: len(read()) >= 10 * PARTITIONS)
    gw.restart()
    _produce(target, topic, 1000, 10)
    after = {(p, o) for p in range(PARTITIONS) for o in range(10, 20)}
    until("the records produced after the restart", lambda: after <= set(read()))
    time.sleep(1)
    got = read()
    # A record is printed once its commit was answered: never twice.
    assert len(got) == len(set(got)) and set(got) <= {
        (p, o) for p in range(PARTITIONS) for o in range(20)
    }
    # Both lost their partitions with the gateway's memory, rejoined and share them again.
    until("the group to settle again", lambda: all(len(m.assigned()) == 3 for m in members))
    assert all({"assigned": []} in lines(m.out) for m in members)
    for m in members:
        m.stop()
    described = json.loads(cli(gw, "group", "describe", group, topic, "--json").stdout)
    assert {p["partition"]: p["committed"] for p in described["partitions"]} == dict.fromkeys(
        range(PARTITIONS), 20
    )


# --------------------------------------------------------------------------------------
# Exact frames
# --------------------------------------------------------------------------------------
def _request(api_key: int, version: int, **values: Any) -> Any:
    return build(load_request_schema(api_key, version), values)


def _beat(
    conn: RawKafka,
    group: str,
    member: str,
    epoch: int,
    topics: list[str] | None = None,
    owned: list[tuple[uuid.UUID, list[int]]] | None = None,
    **more: Any,
) -> Any:
    return conn.call(
        _request(
            HEARTBEAT,
            1,
            group_id=group,
            member_id=member,
            member_epoch=epoch,
            rebalance_timeout=dt.timedelta(seconds=30 if epoch == 0 else -0.001),
            subscribed_topic_names=topics,
            topic_partitions=None
            if owned is None
            else [{"topic_id": t, "partitions": ps} for t, ps in owned],
            **more,
        )
    )


def _assigned(answer: Any) -> list[tuple[uuid.UUID, list[int]]]:
    if answer.assignment is None:
        return []
    return [(t.topic_id, sorted(t.partitions)) for t in answer.assignment.topic_partitions]


def _commit(conn: RawKafka, group: str, member: str, epoch: int, topic: str, p: int) -> ErrorCode:
    answer = conn.call(
        _request(
            8,
            9,
            group_id=group,
            generation_id_or_member_epoch=epoch,
            member_id=member,
            topics=[{"name": topic, "partitions": [{"partition_index": p, "committed_offset": 0}]}],
        )
    )
    return answer.topics[0].partitions[0].error_code  # type: ignore[no-any-return]


def _topic_id(conn: RawKafka, topic: str) -> uuid.UUID:
    meta = conn.call(_request(3, 12, topics=[{"name": topic}], allow_auto_topic_creation=False))
    return meta.topics[0].topic_id  # type: ignore[no-any-return]


def test_members_revoke_before_others_receive_and_stale_epochs_are_fenced(
    kafka: KafkaTarget, topic: str
) -> None:
    group = f"fence-{secrets.token_hex(4)}"
    a, b = f"a-{secrets.token_hex(4)}", f"b-{secrets.token_hex(4)}"
    with RawKafka(kafka) as conn:
        conn.authenticate(kafka.tenant, kafka.key)
        tid = _topic_id(conn, topic)
        # Metadata by topic id (how a member names what it was assigned) finds the table.
        by_id = conn.call(_request(3, 12, topics=[{"topic_id": tid, "name": None}]))
        assert (by_id.topics[0].name, by_id.topics[0].error_code) == (topic, ErrorCode.none)
        first = _beat(conn, group, a, 0, [topic], [])
        assert first.error_code == ErrorCode.none and first.member_id == a
        epoch_a = first.member_epoch
        assert epoch_a >= 1 and _assigned(first) == [(tid, [0, 1])]
        assert first.heartbeat_interval.total_seconds() > 0
        # b joins: a must give one partition up first; b gets nothing it still holds.
        joined = _beat(conn, group, b, 0, [topic], [])
        assert joined.error_code == ErrorCode.none and _assigned(joined) == []
        told = _beat(conn, group, a, epoch_a, None, [(tid, [0, 1])])
        assert told.member_epoch == epoch_a and _assigned(told) == [(tid, [0])]
        # While a revokes, b still gets nothing; a may commit what it revokes.
        assert _assigned(_beat(conn, group, b, joined.member_epoch)) == []
        assert _commit(conn, group, a, epoch_a, topic, 1) == ErrorCode.none
        # A wrong epoch is fenced, and so is an unknown member; b may not commit a's share.
        assert _beat(conn, group, a, epoch_a + 7).error_code == ErrorCode.fenced_member_epoch
        assert _beat(conn, group, "nobody", 3).error_code == ErrorCode.unknown_member_id
        assert _commit(conn, group, b, joined.member_epoch, topic, 1) == (
            ErrorCode.stale_member_epoch
        )
        assert _commit(conn, group, "nobody", 1, topic, 0) == ErrorCode.unknown_member_id
        assert _commit(conn, group, "", -1, topic, 0) == ErrorCode.unknown_member_id
        # a says it let partition 1 go: it moves to the new epoch, then b receives it.
        acked = _beat(conn, group, a, epoch_a, None, [(tid, [0])])
        assert acked.member_epoch > epoch_a and _assigned(acked) == [(tid, [0])]
        got = _beat(conn, group, b, joined.member_epoch, None, [])
        assert _assigned(got) == [(tid, [1])] and got.member_epoch == acked.member_epoch
        assert _commit(conn, group, a, epoch_a, topic, 0) == ErrorCode.stale_member_epoch
        assert _commit(conn, group, a, acked.member_epoch, topic, 0) == ErrorCode.none
        # OffsetFetch v9 checks a member and its epoch; v8 asks several groups at once.
        asked = [{"name": topic, "partition_indexes": [0, 1]}]

        def fetch(member: str | None, epoch: int) -> Any:
            one = {"group_id": group, "member_id": member, "member_epoch": epoch, "topics": asked}
            return conn.call(_request(9, 9, groups=[one])).groups[0]

        mine = fetch(a, acked.member_epoch)
        assert mine.error_code == ErrorCode.none
        assert [p.committed_offset for p in mine.topics[0].partitions] == [0, 0]
        assert fetch(a, epoch_a).error_code == ErrorCode.stale_member_epoch
        assert fetch("nobody", 1).error_code == ErrorCode.unknown_member_id
        assert fetch(None, -1).error_code == ErrorCode.none  # an admin's fetch
        other = f"never-{secrets.token_hex(4)}"
        both = conn.call(
            _request(
                9,
                8,
                groups=[{"group_id": group, "topics": asked}, {"group_id": other, "topics": None}],
            )
        ).groups
        assert [(g.group_id, g.error_code) for g in both] == [
            (group, ErrorCode.none),
            (other, ErrorCode.none),
        ]
        assert [p.committed_offset for p in both[0].topics[0].partitions] == [0, 0]
        assert both[1].topics == ()
        # The old epoch is still taken from a (its answer may have been lost) while it
        # owns nothing new; more than that is fenced.
        assert _beat(conn, group, a, epoch_a, None, [(tid, [0])]).error_code == ErrorCode.none
        assert _beat(conn, group, a, epoch_a, None, [(tid, [0, 1])]).error_code == (
            ErrorCode.fenced_member_epoch
        )
        described = conn.call(_request(DESCRIBE, 1, group_ids=[group])).groups[0]
        assert described.group_state == "Stable"
        held = {
            m.member_id: [(t.topic_id, list(t.partitions)) for t in m.assignment.topic_partitions]
            for m in described.members
        }
        assert held == {a: [(tid, [0])], b: [(tid, [1])]}
        listed = conn.call(_request(16, 5, states_filter=[], types_filter=["Consumer"])).groups
        assert ("consumer", "Stable") in [
            (g.group_type, g.group_state) for g in listed if g.group_id == group
        ]
        # A classic member cannot join it, DescribeGroups says what it is.
        classic = conn.call(
            _request(
                11,
                5,
                group_id=group,
                session_timeout=10_000,
                rebalance_timeout=10_000,
                member_id="",
                protocol_type="consumer",
                protocols=[{"name": "range", "metadata": b"m"}],
            )
        )
        assert classic.error_code == ErrorCode.inconsistent_group_protocol
        old = conn.call(_request(15, 5, groups=[group])).groups[0]
        assert old.error_code == ErrorCode.group_id_not_found
        # a leaves: its partition is free at once, and b receives it at its next heartbeat.
        left = _beat(conn, group, a, -1)
        assert (left.error_code, left.member_epoch) == (ErrorCode.none, -1)
        whole = _beat(conn, group, b, got.member_epoch, None, [(tid, [1])])
        assert _assigned(whole) == [(tid, [0, 1])]
        assert _beat(conn, group, a, acked.member_epoch).error_code == ErrorCode.unknown_member_id
        # b leaves too: the group is gone, its committed offsets stay the core's.
        assert _beat(conn, group, b, whole.member_epoch, None, [(tid, [0, 1])]).error_code == 0
        assert _beat(conn, group, b, -1).error_code == ErrorCode.none
        gone = conn.call(_request(DESCRIBE, 1, group_ids=[group])).groups[0]
        assert gone.error_code == ErrorCode.group_id_not_found
    described_cli = json.loads(
        cli(kafka.gateway, "group", "describe", group, topic, "--json").stdout
    )
    assert {p["partition"]: p["committed"] for p in described_cli["partitions"]} == {0: 0, 1: 0}


def test_a_tenant_cannot_join_describe_or_read_another_tenants_group(
    kafka: KafkaTarget, other_tenant: KafkaTarget, theirs: str, topic: str
) -> None:
    group = f"iso-{secrets.token_hex(4)}"
    with RawKafka(kafka) as mine, RawKafka(other_tenant) as other:
        mine.authenticate(kafka.tenant, kafka.key)
        other.authenticate(other_tenant.tenant, other_tenant.key)
        their_id = _topic_id(other, theirs)
        joined = _beat(other, group, "b-member", 0, [theirs], [])
        assert _assigned(joined) == [(their_id, [0])]
        # The same group id in another tenant is another group; its topic is no topic here.
        described = mine.call(_request(DESCRIBE, 1, group_ids=[group])).groups[0]
        assert described.error_code == ErrorCode.group_id_not_found
        intruder = _beat(mine, group, "a-member", 0, [theirs], [])
        assert intruder.error_code == ErrorCode.none and _assigned(intruder) == []
        assert _beat(mine, group, "b-member", joined.member_epoch).error_code == (
            ErrorCode.unknown_member_id
        )
        by_id = mine.call(_request(3, 12, topics=[{"topic_id": their_id, "name": None}]))
        assert by_id.topics[0].error_code == ErrorCode.unknown_topic_id
        assert by_id.topics[0].name is None
        # Owning their partition does not make it mine to commit.
        assert _commit(mine, group, "a-member", intruder.member_epoch, theirs, 0) == (
            ErrorCode.unknown_topic_or_partition
        )
        # A long subscription (resolved in one listing of the tenant's tables) likewise.
        names = [topic, theirs, *(f"no.such{i}" for i in range(20))]
        crowd = _beat(mine, f"crowd-{secrets.token_hex(4)}", "c", 0, names, [])
        assert _assigned(crowd) == [(_topic_id(mine, topic), [0, 1])]
        theirs_now = other.call(_request(DESCRIBE, 1, group_ids=[group])).groups[0]
        assert [m.member_id for m in theirs_now.members] == ["b-member"]


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"member_id": ""}, ErrorCode.invalid_request),
        ({"group_id": "no spaces allowed"}, ErrorCode.invalid_group_id),
        ({"member_epoch": -3}, ErrorCode.invalid_request),
        ({"subscribed_topic_names": None}, ErrorCode.invalid_request),
        ({"rebalance_timeout": dt.timedelta(milliseconds=-1)}, ErrorCode.invalid_request),
        ({"subscribed_topic_regex": "^k.*"}, ErrorCode.invalid_request),
        ({"server_assignor": "magic"}, ErrorCode.unsupported_assignor),
        ({"subscribed_topic_names": ["x" * 300]}, ErrorCode.invalid_request),
        (
            {"topic_partitions": [{"topic_id": uuid.uuid4(), "partitions": [0]}]},
            ErrorCode.invalid_request,
        ),
    ],
)
def test_a_bad_heartbeat_is_answered_with_kafkas_error(
    kafka: KafkaTarget, topic: str, change: dict[str, Any], code: ErrorCode
) -> None:
    values = {
        "group_id": f"bad-{secrets.token_hex(4)}",
        "member_id": "m",
        "member_epoch": 0,
        "rebalance_timeout": dt.timedelta(seconds=30),
        "subscribed_topic_names": [topic],
        "topic_partitions": [],
        **change,
    }
    with RawKafka(kafka) as conn:
        conn.authenticate(kafka.tenant, kafka.key)
        answer = conn.call(_request(HEARTBEAT, 1, **values))
        assert answer.error_code == code and answer.error_message
        # The connection still serves.
        assert _beat(conn, f"ok-{secrets.token_hex(4)}", "m", 0, [topic], []).error_code == 0
