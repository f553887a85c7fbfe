"""Kafka's classic group protocol: confluent-kafka consumers ``subscribe()``d to a table
share its partitions with their own assignor, take over a SIGKILLed member's partitions
from its committed offsets, and commit the offsets ``tidegate group describe`` shows."""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema

from gateway.server.kafka.protocol import ErrorCode, build
from gateway.server.kafka.published import CLASSIC
from tests.integration.test_first_hour import cli
from tests.kafka.clients import DEADLINE_S, ConfluentKafka, librdkafka_settings
from tests.kafka.conftest import KafkaTarget
from tests.kafka.members import Member, described_holdings, holding, until
from tests.kafka.raw import RawKafka

pytestmark = pytest.mark.integration

PARTITIONS = 6


def _produce(kafka: KafkaTarget, topic: str, first: int, per_partition: int) -> None:
    values = [
        (p, json.dumps({"id": first + p * per_partition + i}).encode())
        for p in range(PARTITIONS)
        for i in range(per_partition)
    ]
    ConfluentKafka().produce(kafka, topic, values)


def test_a_group_of_three_reads_every_record_once_while_a_member_is_killed(
    kafka: KafkaTarget, members: list[Member], tmp_path: Path
) -> None:
    topic = f"g{secrets.token_hex(5)}.clicks"
    with kafka.gateway.client() as c:
        c.create_table(topic, {"id": "int64"}, partitions=PARTITIONS)
    group = f"readers-{secrets.token_hex(4)}"
    settings = {
        **librdkafka_settings(kafka),
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "partition.assignment.strategy": "cooperative-sticky",
    }
    _produce(kafka, topic, 0, 10)
    members.extend(Member(tmp_path, n, settings, topic) for n in range(3))

    def read() -> list[tuple[int, int]]:
        return [r for m in members for r in m.read()]

    # Every member holds two partitions once the group settled, and all was read.
    until("the group to settle", lambda: all(len(m.assigned()) == 2 for m in members))
    until("the first records", lambda: len(read()) >= 10 * PARTITIONS)
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
        lambda: described_holdings(kafka.gateway, group, topic, CLASSIC) == holding(members[1:]),
    )
    shown = cli(kafka.gateway, "group", "describe", group, topic).stdout
    assert shown.count(CLASSIC) == 2 and "stable" in shown.splitlines()[0]
    for m in members[1:]:
        m.stop()
    described = json.loads(cli(kafka.gateway, "group", "describe", group, topic, "--json").stdout)
    committed = {p["partition"]: p["committed"] for p in described["partitions"]}
    assert committed == dict.fromkeys(range(PARTITIONS), 20)


def _request(api_key: int, version: int, **values: Any) -> Any:
    return build(load_request_schema(api_key, version), values)


def _join(conn: RawKafka, group: str, member: str = "") -> Any:
    return conn.call(
        _request(
            11,
            5,
            group_id=group,
            session_timeout=10_000,
            rebalance_timeout=10_000,
            member_id=member,
            protocol_type="consumer",
            protocols=[{"name": "range", "metadata": b"m"}],
        )
    )


def _beat(conn: RawKafka, group: str, member: str, generation: int) -> ErrorCode:
    answer = conn.call(_request(12, 4, group_id=group, member_id=member, generation_id=generation))
    return answer.error_code  # type: ignore[no-any-return]


def _commit(conn: RawKafka, group: str, member: str, generation: int, topic: str) -> ErrorCode:
    answer = conn.call(
        _request(
            8,
            8,
            group_id=group,
            generation_id_or_member_epoch=generation,
            member_id=member,
            topics=[{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 0}]}],
        )
    )
    return answer.topics[0].partitions[0].error_code  # type: ignore[no-any-return]


def test_a_stale_member_is_refused_as_kafka_refuses_it(kafka: KafkaTarget, topic: str) -> None:
    group = f"fenced-{secrets.token_hex(4)}"
    with RawKafka(kafka) as a, RawKafka(kafka) as b:
        for conn in (a, b):
            conn.authenticate(kafka.tenant, kafka.key)
        first = _join(a, group)
        assert (first.error_code, first.generation_id) == (ErrorCode.none, 1)
        me = first.member_id
        assert first.leader == me and [m.member_id for m in first.members] == [me]
        synced = a.call(
            _request(
                14,
                5,
                group_id=group,
                generation_id=1,
                member_id=me,
                protocol_type="consumer",
                protocol_name="range",
                assignments=[{"member_id": me, "assignment": b"all of it"}],
            )
        )
        assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"all of it")
        assert _beat(a, group, me, 1) == ErrorCode.none
        assert _beat(a, group, me, 0) == ErrorCode.illegal_generation
        assert _beat(a, group, "nobody", 1) == ErrorCode.unknown_member_id
        assert _commit(a, group, "nobody", 1, topic) == ErrorCode.unknown_member_id
        assert _commit(a, group, "", -1, topic) == ErrorCode.unknown_member_id
        # A second member joins: the first hears of the rebalance, and may not commit.
        with ThreadPoolExecutor(1) as pool:
            second = pool.submit(_join, b, group)
            until("the rebalance", lambda: _beat(a, group, me, 1) != ErrorCode.none)
            assert _beat(a, group, me, 1) == ErrorCode.rebalance_in_progress
            assert _commit(a, group, me, 1, topic) == ErrorCode.rebalance_in_progress
            again = _join(a, group, me)
            other = second.result(timeout=30)
        assert again.generation_id == other.generation_id == 2
        assert again.leader == me and len(again.members) == 2 and other.members == ()
        # The old generation is fenced; the new one commits once the leader synced.
        assert _commit(a, group, me, 1, topic) == ErrorCode.illegal_generation
        assert _commit(a, group, me, 2, topic) == ErrorCode.none
        described = a.call(_request(15, 5, groups=[group])).groups[0]
        assert described.group_state in ("CompletingRebalance", "Stable")
        assert len(described.members) == 2
        listed = a.call(_request(16, 4)).groups
        assert group in [g.group_id for g in listed]
        left = b.call(_request(13, 4, group_id=group, members=[{"member_id": other.member_id}]))
        assert left.members[0].error_code == ErrorCode.none
        assert _beat(a, group, me, 2) == ErrorCode.rebalance_in_progress


def test_kcat_reads_a_table_as_a_balanced_group(kafka: KafkaTarget, topic: str) -> None:
    rows = [{"id": i, "name": "n", "price": 1.0, "ok": True} for i in range(6)]
    with kafka.gateway.client() as c:
        c.append(topic, rows[:4], partition=0)
        c.append(topic, rows[4:], partition=1)
    group = f"kcat-{secrets.token_hex(4)}"
    settings = [f"{k}={v}" for k, v in librdkafka_settings(kafka).items()]
    options = [arg for setting in settings for arg in ("-X", setting)]
    options += ["-X", "auto.offset.reset=earliest", "-G", group, "-e", "-f", "%p %o\\n"]
    out = subprocess.run(
        ["kcat", *options, topic],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=True,
    ).stdout.split()
    got = sorted(zip(map(int, out[::2]), map(int, out[1::2]), strict=True))
    assert got == [(0, o) for o in range(4)] + [(1, o) for o in range(2)]
    described = json.loads(cli(kafka.gateway, "group", "describe", group, topic, "--json").stdout)
    assert {p["partition"]: p["committed"] for p in described["partitions"]} == {0: 4, 1: 2}
