"""Committed offsets over Kafka (FindCoordinator, OffsetCommit, OffsetFetch) are the
gateway's consumer-group offsets, the ones the SDK and HTTP show (issue 41, groups)."""

from __future__ import annotations

import json
import secrets

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.kafka.clients import librdkafka_settings
from tests.kafka.conftest import KafkaTarget

pytestmark = pytest.mark.integration


def consumer(target: KafkaTarget, group: str) -> Consumer:
    return Consumer({**librdkafka_settings(target), "group.id": group, "enable.auto.commit": False})


def test_a_consumer_commits_offsets_the_sdk_sees_and_a_new_one_resumes(
    kafka: KafkaTarget, topic: str
) -> None:
    rows = [{"id": i, "name": "n", "price": 1.0, "ok": True} for i in range(6)]
    with kafka.gateway.client() as c:
        c.append(topic, rows[:4], partition=0)
        c.append(topic, rows[4:], partition=1)
    group = f"g{secrets.token_hex(4)}"
    first = consumer(kafka, group)
    try:
        first.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
        # Nothing committed yet: the coordinator says so for both partitions.
        before = first.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], 30)
        assert [tp.offset for tp in before] == [-1001, -1001]  # librdkafka's OFFSET_INVALID
        read = 0
        while read < 3:
            msg = first.poll(10)
            if msg is not None and msg.error() is None and msg.partition() == 0:
                read += 1
        committed = first.commit(
            offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 1)],
            asynchronous=False,
        )
        assert all(tp.error is None for tp in committed), committed
    finally:
        first.close()

    # The gateway's own view of the group: the same offsets.
    namespace, name = topic.split(".")
    with kafka.gateway.http_client() as h:
        got = h.get(f"/v1/groups/{group}/tables/{namespace}/{name}/offsets")
        assert got.status_code == 200, got.text
        assert {o["partition"]: o["offset"] for o in got.json()["offsets"]} == {0: 3, 1: 1}

    # A consumer of the group started afresh resumes where the first committed.
    second = consumer(kafka, group)
    try:
        second.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        seen = set()
        while len(seen) < 2:
            msg = second.poll(10)
            if msg is not None and msg.error() is None:
                seen.add((msg.partition(), msg.offset(), json.loads(msg.value())["id"]))
        assert seen == {(0, 3, 3), (1, 1, 5)}
    finally:
        second.close()


def test_a_commit_for_another_tenants_table_is_refused(
    kafka: KafkaTarget, other_tenant: KafkaTarget, theirs: str
) -> None:
    mine = consumer(kafka, "spy")
    try:
        answer = mine.commit(offsets=[TopicPartition(theirs, 0, 1)], asynchronous=False)
        assert answer[0].error is not None
    except Exception as exc:  # librdkafka raises the partition's error
        assert "UNKNOWN_TOPIC_OR_PART" in str(exc) or "Unknown topic" in str(exc), exc
    finally:
        mine.close()
    with kafka.gateway.http_client(api_key=other_tenant.key) as h:
        namespace, name = theirs.split(".")
        got = h.get(f"/v1/groups/spy/tables/{namespace}/{name}/offsets").json()
        assert got["offsets"] == []
