"""Topics created over Kafka (CreateTopics) are tables of the raw schema: each record as it
came, key, value, headers and the producer's timestamp byte for byte (issue 41)."""

from __future__ import annotations

import base64
import json
import secrets
import subprocess

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.kafka.clients import KafkaPython, Kcat, librdkafka_settings
from tests.kafka.conftest import KafkaTarget

pytestmark = pytest.mark.integration


def test_a_topic_created_over_kafka_keeps_records_as_they_came(kafka: KafkaTarget) -> None:
    topic = f"raw{secrets.token_hex(4)}.events"
    admin = AdminClient(librdkafka_settings(kafka))
    created = admin.create_topics(
        [NewTopic(topic, 3, config={"retention.ms": "86400000"}), NewTopic("no-dot", 1)]
    )
    created[topic].result(30)
    with pytest.raises(KafkaException, match=r"namespace\.name"):
        created["no-dot"].result(30)
    again = admin.create_topics([NewTopic(topic, 1)])[topic]
    with pytest.raises(KafkaException, match="already exists"):
        again.result(30)
    with kafka.gateway.client() as c:
        info = c.describe_table(topic)
        assert info.partitions == 3 and info.retention_ms == 86_400_000
        assert [f.name for f in info.fields] == ["key", "value", "headers", "timestamp"]

    sent = [
        (b"k1", b"\x00\x01 not json", [("h", b"v"), ("empty", None)], 1_700_000_000_123),
        (None, b"value only", [], 1_700_000_000_456),
        (b"tombstone", None, [("why", b"deleted")], 1_700_000_000_789),
    ]
    producer = Producer({**librdkafka_settings(kafka), "compression.type": "zstd"})
    for key, value, headers, stamp in sent:
        producer.produce(topic, value, key=key, headers=headers, partition=2, timestamp=stamp)
    assert producer.flush(30) == 0

    # kafka-python reads them back byte for byte, headers and timestamps included.
    got = KafkaPython().consume(kafka, topic, [2], len(sent))
    assert [(m.offset, m.key, m.value, m.timestamp_ms) for m in got] == [
        (i, key, value, stamp) for i, (key, value, _, stamp) in enumerate(sent)
    ]
    # kcat sees the headers too.
    ran = subprocess.run(
        [*Kcat()._args(kafka), "-C", "-t", topic, "-p", "2", "-o", "beginning", "-e", "-J"],
        capture_output=True,
        check=True,
        timeout=60,
    )
    first = json.loads(ran.stdout.splitlines()[0])
    assert first["headers"] == ["h", "v", "empty", None]
    # The SDK reads the same rows.
    with kafka.gateway.client() as c:
        rows = c.read(topic, partition=2, offset=0).to_pylist()
    assert [(r["key"], r["value"]) for r in rows] == [(k, v) for k, v, _, _ in sent]
    assert rows[0]["headers"] == [{"key": "h", "value": b"v"}, {"key": "empty", "value": None}]
    assert base64.b64encode(rows[0]["value"]) == base64.b64encode(sent[0][1])


def test_a_topic_created_with_a_schema_in_its_configs_is_a_typed_or_key_table(
    kafka: KafkaTarget,
) -> None:
    """``tidegate.schema`` (JSON, as ``POST /v1/tables`` takes it), ``tidegate.key.columns``
    and ``tidegate.primary.key`` shape the table CreateTopics makes; a config that cannot
    be one is INVALID_CONFIG with one sentence naming it, and nothing is made."""
    ns = f"typed{secrets.token_hex(4)}"
    schema = json.dumps({"id": "int64", "name": "string"})
    admin = AdminClient(librdkafka_settings(kafka))
    created = admin.create_topics(
        [
            NewTopic(f"{ns}.orders", 1, config={"tidegate.schema": schema,
                                                "tidegate.primary.key": "id"}),
            NewTopic(f"{ns}.clicks", 2, config={"tidegate.schema": schema,
                                                "tidegate.key.columns": "name"}),
            NewTopic(f"{ns}.notjson", 1, config={"tidegate.schema": "{id: int64"}),
            NewTopic(f"{ns}.deep", 1, config={"tidegate.schema": "[" * 5_000}),
            NewTopic(f"{ns}.badtype", 1, config={"tidegate.schema": '{"id": "int65"}'}),
            NewTopic(f"{ns}.nokey", 1, config={"tidegate.primary.key": "id"}),
            NewTopic(f"{ns}.badkey", 1, config={"tidegate.schema": schema,
                                                "tidegate.primary.key": "nope"}),
        ]
    )  # fmt: skip
    created[f"{ns}.orders"].result(30)
    created[f"{ns}.clicks"].result(30)
    refused = {"notjson": "is not JSON", "deep": "is not JSON", "badtype": "int65",
               "nokey": "give it in tidegate.schema", "badkey": "nope"}  # fmt: skip
    for name, says in refused.items():
        with pytest.raises(KafkaException) as err:
            created[f"{ns}.{name}"].result(30)
        assert err.value.args[0].code() == KafkaError.INVALID_CONFIG, err.value
        assert says in str(err.value), err.value
    with kafka.gateway.client() as c:
        orders, clicks = c.describe_table(f"{ns}.orders"), c.describe_table(f"{ns}.clicks")
        assert [f.name for f in orders.fields] == ["id", "name"]
        assert orders.primary_key == ("id",) and clicks.key_columns == ("name",)
        assert {t.ref.name for t in c.list_tables(ns)} == {"orders", "clicks"}
    # JSON records are its rows; a key's later record replaces its earlier one.
    producer = Producer(librdkafka_settings(kafka))
    for row in [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 1, "name": "c"}]:
        producer.produce(f"{ns}.orders", json.dumps(row).encode(), partition=0)
    assert producer.flush(30) == 0
    with kafka.gateway.client() as c:
        got = c.get(f"{ns}.orders", [{"id": 1}, {"id": 2}]).to_pylist()
    assert sorted((r["id"], r["name"]) for r in got) == [(1, "c"), (2, "b")]


def test_a_topic_deleted_over_kafka_is_dropped(
    kafka: KafkaTarget, other_tenant: KafkaTarget, theirs: str
) -> None:
    topic = f"del{secrets.token_hex(4)}.events"
    admin = AdminClient(librdkafka_settings(kafka))
    admin.create_topics([NewTopic(topic, 1)])[topic].result(30)
    done = admin.delete_topics([topic, theirs, "no.such"])
    done[topic].result(30)
    # Another tenant's table is as unknown as one that does not exist, and stays.
    for name in (theirs, "no.such"):
        with pytest.raises(KafkaException, match="UNKNOWN_TOPIC_OR_PART"):
            done[name].result(30)
    with kafka.gateway.client() as c:
        assert topic not in {f"{t.ref.namespace}.{t.ref.name}" for t in c.list_tables()}
    with kafka.gateway.client(api_key=other_tenant.key) as b:
        assert b.read(theirs, partition=0, offset=0).num_rows == 1
