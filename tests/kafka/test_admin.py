"""Kafka's admin APIs through admin clients nobody here wrote (confluent-kafka's
``AdminClient``, kafka-python's ``KafkaAdminClient``) against a real gateway: topic configs
are the table's settings the SDK and HTTP change, CreatePartitions is refused in one
sentence, DescribeCluster names the advertised listener, OffsetDelete forgets the
committed offsets the SDK shows, and another tenant's topic answers as one that does not
exist (issue 41)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
)
from kafka.admin import ConfigResource as PyConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.errors import GroupIdNotFoundError
from kafka.structs import TopicPartition as PyTopicPartition
from kio.schema.describe_cluster.v1.request import DescribeClusterRequest

from gateway.server.kafka.protocol import ErrorCode
from tests.kafka.clients import DEADLINE_S, _python_config, librdkafka_settings
from tests.kafka.conftest import KafkaTarget
from tests.kafka.raw import RawKafka

pytestmark = pytest.mark.integration


@pytest.fixture
def admin(kafka: KafkaTarget) -> AdminClient:
    return AdminClient(librdkafka_settings(kafka))


@pytest.fixture
def py_admin(kafka: KafkaTarget) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(**_python_config(kafka), request_timeout_ms=30_000)
    try:
        yield client
    finally:
        client.close()


def _topic_configs(admin: AdminClient, topic: str) -> dict[str, Any]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result(30)  # type: ignore[no-any-return]


def _alter(admin: AdminClient, topic: str, *entries: ConfigEntry) -> None:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=list(entries))
    admin.incremental_alter_configs([resource])[resource].result(30)


def _set(name: str, value: str) -> ConfigEntry:
    return ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)


def _error(exc: pytest.ExceptionInfo[KafkaException]) -> tuple[str, str]:
    err = exc.value.args[0]
    return err.name(), err.str()


# --------------------------------------------------------------------------------------
# DescribeConfigs, IncrementalAlterConfigs
# --------------------------------------------------------------------------------------
def test_topic_configs_are_the_tables_settings(
    kafka: KafkaTarget, admin: AdminClient, py_admin: KafkaAdminClient, topic: str
) -> None:
    configs = _topic_configs(admin, topic)
    retention = configs["retention.ms"]
    assert retention.value == "-1" and not retention.is_read_only and retention.is_default
    assert configs["tidegate.retention.records"].value == "-1"
    assert configs["tidegate.key.columns"].value == "id"
    assert configs["tidegate.key.columns"].is_read_only
    assert configs["message.timestamp.type"].value == "LogAppendTime"

    # Altered over Kafka: the SDK (and HTTP, the same table) sees the new retention.
    _alter(admin, topic, _set("retention.ms", "3600000"), _set("tidegate.retention.records", "500"))
    with kafka.gateway.client() as c:
        info = c.describe_table(topic)
        assert (info.retention_ms, info.retention_records) == (3_600_000, 500)
        # Altered through the SDK: Kafka's admin clients see it.
        c.alter_table(topic, retention_ms=7_200_000)
    configs = _topic_configs(admin, topic)
    assert configs["retention.ms"].value == "7200000" and not configs["retention.ms"].is_default
    # kafka-python reads the same (its default filter: the configs set on the topic).
    described = py_admin.describe_configs([PyConfigResource(ConfigResourceType.TOPIC, topic)])
    assert {k: v["value"] for k, v in described["topic"][topic].items()} == {
        "retention.ms": "7200000",
        "tidegate.retention.records": "500",
    }
    assert described["topic"][topic]["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    # kafka-python alters them too (through IncrementalAlterConfigs, which it prefers).
    altered = py_admin.alter_configs(
        [PyConfigResource(ConfigResourceType.TOPIC, topic, {"retention.ms": "5000"})]
    )
    assert altered == {"topic": {topic: "OK"}}
    with kafka.gateway.client() as c:
        assert c.describe_table(topic).retention_ms == 5000

    # DELETE and -1 remove the limits, as Kafka's default (no limit) is.
    _alter(
        admin,
        topic,
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        _set("tidegate.retention.records", "-1"),
    )
    with kafka.gateway.client() as c:
        info = c.describe_table(topic)
        assert (info.retention_ms, info.retention_records) == (None, None)


@pytest.mark.parametrize(
    ("entry", "sentence"),
    [
        (
            ("no.such.config", "1"),
            "'no.such.config' is not a config of topic {topic}; the configs that may be "
            "altered are retention.ms, tidegate.retention.records",
        ),
        (
            ("cleanup.policy", "compact"),
            "config 'cleanup.policy' of topic {topic} is read-only (fixed when the table was "
            "created); the configs that may be altered are retention.ms, "
            "tidegate.retention.records",
        ),
        (
            ("retention.ms", "soon"),
            "retention.ms 'soon' of topic {topic} is not accepted: give a whole number from "
            "1 to 9223372036854775807, or -1 for no limit",
        ),
    ],
    ids=["unknown", "read-only", "not-a-number"],
)
def test_a_bad_config_change_is_refused_in_one_sentence_and_changes_nothing(
    kafka: KafkaTarget,
    admin: AdminClient,
    topic: str,
    entry: tuple[str, str],
    sentence: str,
) -> None:
    name, value = entry
    with pytest.raises(KafkaException) as refused:
        # The good change beside it is not applied either: a topic's changes are all or none.
        _alter(admin, topic, _set("tidegate.retention.records", "10"), _set(name, value))
    assert _error(refused) == ("INVALID_CONFIG", sentence.format(topic=topic))
    with kafka.gateway.client() as c:
        assert c.describe_table(topic).retention_records is None


def test_another_tenants_topic_has_no_configs(
    kafka: KafkaTarget, admin: AdminClient, theirs: str, other_tenant: KafkaTarget
) -> None:
    with pytest.raises(KafkaException) as described:
        _topic_configs(admin, theirs)
    assert _error(described)[0] == "UNKNOWN_TOPIC_OR_PART"
    with pytest.raises(KafkaException) as altered:
        _alter(admin, theirs, _set("retention.ms", "1000"))
    assert _error(altered) == ("UNKNOWN_TOPIC_OR_PART", f"{theirs}: no such topic")
    with kafka.gateway.client(api_key=other_tenant.key) as b:
        assert b.describe_table(theirs).retention_ms is None
    # Its owner sees and changes them.
    theirs_admin = AdminClient(librdkafka_settings(other_tenant))
    _alter(theirs_admin, theirs, _set("retention.ms", "1000"))
    assert _topic_configs(theirs_admin, theirs)["retention.ms"].value == "1000"


def test_configs_of_what_is_not_a_topic_are_refused_in_one_sentence(kafka: KafkaTarget) -> None:
    from kio.schema.describe_configs.v4 import request as dc

    with RawKafka(kafka) as raw:
        raw.authenticate(kafka.tenant, kafka.key)
        answer = raw.call(
            dc.DescribeConfigsRequest(
                resources=(
                    # A group's configs (Kafka 4's type 32), then this broker's (none).
                    dc.DescribeConfigsResource(resource_type=32, resource_name="g"),
                    dc.DescribeConfigsResource(resource_type=4, resource_name="0"),
                )
            )
        )
    group, broker = answer.results
    assert group.error_code == ErrorCode.invalid_request
    assert group.error_message == (
        "resource 'g' of type 32 has no configs here: this listener answers topics (type 2); "
        "the gateway's own settings are in its configuration, not changed over Kafka"
    )
    assert (broker.error_code, broker.configs) == (ErrorCode.none, ())


# --------------------------------------------------------------------------------------
# CreatePartitions
# --------------------------------------------------------------------------------------
def test_create_partitions_is_refused_in_one_sentence(
    kafka: KafkaTarget, admin: AdminClient, py_admin: KafkaAdminClient, topic: str, theirs: str
) -> None:
    done = admin.create_partitions(
        [NewPartitions(topic, 4), NewPartitions(theirs, 4), NewPartitions("no.such", 4)]
    )
    with pytest.raises(KafkaException) as more:
        done[topic].result(30)
    assert _error(more) == (
        "INVALID_PARTITIONS",
        f"topic {topic} keeps its 2 partitions: a Tidegate table's partition count is fixed "
        "at creation (its keys are routed by it); create a table with 4 partitions and copy "
        "the records into it",
    )
    for name in (theirs, "no.such"):
        with pytest.raises(KafkaException) as unknown:
            done[name].result(30)
        assert _error(unknown)[0] == "UNKNOWN_TOPIC_OR_PART"
    with kafka.gateway.client() as c:
        assert c.describe_table(topic).partitions == 2
    # Fewer: refused as Kafka refuses it (kafka-python raises the first error).
    from kafka.admin import NewPartitions as PyNewPartitions
    from kafka.errors import InvalidPartitionsError

    with pytest.raises(InvalidPartitionsError, match="more than the 1 asked"):
        py_admin.create_partitions({topic: PyNewPartitions(1)}, raise_errors=True)


# --------------------------------------------------------------------------------------
# DescribeCluster
# --------------------------------------------------------------------------------------
def test_describe_cluster_names_the_advertised_listener(
    kafka: KafkaTarget, admin: AdminClient, py_admin: KafkaAdminClient, other_tenant: KafkaTarget
) -> None:
    host, port = kafka.bootstrap.rsplit(":", 1)
    cluster = admin.describe_cluster().result(30)
    assert cluster.cluster_id == "tidegate"
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, host, int(port))]
    assert cluster.controller.id == 0
    described = py_admin.describe_cluster()
    assert (described["cluster_id"], described["controller_id"]) == ("tidegate", 0)
    assert [(b["broker_id"], b["host"], b["port"]) for b in described["brokers"]] == [
        (0, host, int(port))
    ]
    # What a tenant may do to the cluster: create topics, describe, write idempotently.
    assert sorted(described["authorized_operations"]) == ["CREATE", "DESCRIBE", "IDEMPOTENT_WRITE"]
    # Every tenant is told the same listener.
    their_admin = AdminClient(librdkafka_settings(other_tenant))
    theirs = their_admin.describe_cluster().result(30)
    assert [(n.host, n.port) for n in theirs.nodes] == [(host, int(port))]
    # Controllers are not served: Kafka's error for an endpoint type a broker does not have.
    with RawKafka(kafka) as raw:
        raw.authenticate(kafka.tenant, kafka.key)
        answer = raw.call(
            DescribeClusterRequest(include_cluster_authorized_operations=False, endpoint_type=2)
        )
    assert answer.error_code == ErrorCode.unsupported_endpoint_type
    assert answer.error_message == (
        "endpoint type 2 is not served: this listener describes its brokers (endpoint type "
        "1), and has no controllers"
    )
    assert answer.brokers == ()


# --------------------------------------------------------------------------------------
# OffsetDelete
# --------------------------------------------------------------------------------------
def _commit(kafka: KafkaTarget, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Offsets committed by a Kafka consumer outside the group protocol."""
    consumer = Consumer({**librdkafka_settings(kafka), "group.id": group})
    try:
        consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


def _fill(kafka: KafkaTarget, topic: str) -> None:
    with kafka.gateway.client() as c:
        for p in (0, 1):
            c.append(
                topic,
                [{"id": i, "name": "n", "price": 1.0, "ok": True} for i in range(3)],
                partition=p,
            )


def test_offset_delete_forgets_the_committed_offsets_the_sdk_shows(
    kafka: KafkaTarget, py_admin: KafkaAdminClient, topic: str
) -> None:
    _fill(kafka, topic)
    group = f"g{secrets.token_hex(4)}"
    _commit(kafka, group, topic, {0: 2, 1: 3})
    with kafka.gateway.client() as c:
        assert c.fetch_offsets(group, topic) == {0: 2, 1: 3}
    deleted = py_admin.delete_group_offsets(group, [PyTopicPartition(topic, 0)])
    assert deleted == {PyTopicPartition(topic, 0): None} or all(
        e is None or getattr(e, "errno", 0) == 0 for e in deleted.values()
    )
    with kafka.gateway.client() as c:
        assert c.fetch_offsets(group, topic) == {1: 3}
        assert [p.committed for p in c.describe_group(group, topic).partitions] == [
            None,
            3,
        ]
    # A group with no offsets nor members anywhere is not found, as Kafka answers it.
    with pytest.raises(GroupIdNotFoundError):
        py_admin.delete_group_offsets(f"none{secrets.token_hex(4)}", [PyTopicPartition(topic, 0)])


def test_offset_delete_refuses_a_topic_the_group_reads(
    kafka: KafkaTarget, py_admin: KafkaAdminClient, topic: str
) -> None:
    _fill(kafka, topic)
    # A classic group of this listener subscribed to the topic.
    group = f"g{secrets.token_hex(4)}"
    member = Consumer(
        {
            **librdkafka_settings(kafka),
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        member.subscribe([topic])
        deadline = time.monotonic() + DEADLINE_S
        while not member.assignment():
            assert time.monotonic() < deadline, "the member got no partitions"
            member.poll(0.2)
        member.commit(
            offsets=[TopicPartition(topic, 0, 1), TopicPartition(topic, 1, 1)],
            asynchronous=False,
        )
        answer = _raw_offset_delete(kafka, group, topic, [0, 1])
        assert answer.error_code == ErrorCode.none
        assert [p.error_code for p in answer.topics[0].partitions] == [
            ErrorCode.group_subscribed_to_topic
        ] * 2
    finally:
        member.close()
    with kafka.gateway.client() as c:
        assert c.fetch_offsets(group, topic) == {0: 1, 1: 1}
        # Once the member left, the offsets may go.
        assert _partition_codes(_raw_offset_delete(kafka, group, topic, [0, 1])) == [0, 0]
        assert c.fetch_offsets(group, topic) == {}

    # A live member of the gateway's own group of the table (an SDK consumer) reads it too.
    sdk_group = f"s{secrets.token_hex(4)}"
    _commit(kafka, sdk_group, topic, {0: 1})
    with kafka.gateway.client() as c:
        with c.consumer(
            topic, group=sdk_group, session_timeout=10, heartbeat_interval=0.1, follow=False
        ) as sdk:
            sdk.poll(0.5)
            assert _partition_codes(_raw_offset_delete(kafka, sdk_group, topic, [0])) == [
                ErrorCode.group_subscribed_to_topic.value
            ]
        assert 0 in c.fetch_offsets(sdk_group, topic)


def test_offset_delete_of_another_tenants_topic_answers_unknown(
    kafka: KafkaTarget, other_tenant: KafkaTarget, theirs: str, topic: str
) -> None:
    group = f"g{secrets.token_hex(4)}"
    # The other tenant's group of the same name commits on its own table.
    _commit(other_tenant, group, theirs, {0: 1})
    _fill(kafka, topic)
    _commit(kafka, group, topic, {0: 1})
    answer = _raw_offset_delete(kafka, group, theirs, [0])
    assert _partition_codes(answer) == [ErrorCode.unknown_topic_or_partition.value]
    with kafka.gateway.client(api_key=other_tenant.key) as b:
        assert b.fetch_offsets(group, theirs) == {0: 1}
    # A partition the table does not have: unknown, the others deleted.
    answer = _raw_offset_delete(kafka, group, topic, [0, 7])
    assert _partition_codes(answer) == [0, ErrorCode.unknown_topic_or_partition.value]
    with kafka.gateway.client() as c:
        assert c.fetch_offsets(group, topic) == {}


def _raw_offset_delete(kafka: KafkaTarget, group: str, topic: str, partitions: list[int]) -> Any:
    from kio.schema.offset_delete.v0 import request as od

    with RawKafka(kafka) as raw:
        raw.authenticate(kafka.tenant, kafka.key)
        return raw.call(
            od.OffsetDeleteRequest(
                group_id=group,
                topics=(
                    od.OffsetDeleteRequestTopic(
                        name=topic,
                        partitions=tuple(
                            od.OffsetDeleteRequestPartition(partition_index=p) for p in partitions
                        ),
                    ),
                ),
            )
        )


def _partition_codes(answer: Any) -> list[int]:
    assert answer.error_code == ErrorCode.none
    return [p.error_code.value for t in answer.topics for p in t.partitions]


def test_a_classic_members_subscription_is_read_or_taken_as_every_topic() -> None:
    import struct

    from gateway.server.kafka.admin import subscribed_topics

    def text(s: str) -> bytes:
        return struct.pack(">h", len(s)) + s.encode()

    # Version 3 (owned partitions, generation, rack after the topics), read by version 0's
    # reader: the topics come first in every version.
    v3 = struct.pack(">hi", 3, 2) + text("a.b") + text("c.d") + struct.pack(">iiih", -1, 0, 5, -1)
    assert subscribed_topics(v3) == {"a.b", "c.d"}
    for garbage in (b"", b"\x00", b"\xff\xff", struct.pack(">hi", 0, 9) + text("a.b")):
        assert subscribed_topics(garbage) is None
