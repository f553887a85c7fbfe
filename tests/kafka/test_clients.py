"""Real Kafka clients produce to and consume from a table on both hot tiers: every
record read back once, equal to what the SDK reads of the same table (issue 41)."""

from __future__ import annotations

import json

import pytest

from gateway.wire.jsonrows import batch_to_rows
from tests.kafka.clients import CLIENTS, KafkaClient
from tests.kafka.conftest import KafkaTarget

pytestmark = pytest.mark.integration


def sdk_records(target: KafkaTarget, topic: str, partitions: int) -> dict[tuple[int, int], dict]:
    """(partition, offset) -> what the SDK reads of that record: its columns as JSON
    values and its timestamp in milliseconds."""
    out = {}
    with target.gateway.client() as c:
        for p in range(partitions):
            table = c.read(topic, partition=p, offset=0)
            if table.num_rows == 0:
                continue
            user = table.select([n for n in table.column_names if not n.startswith("_")])
            rows = batch_to_rows(user.to_batches())
            offsets = table.column("_offset").to_pylist()
            stamps = table.column("_timestamp").cast("int64").to_pylist()
            for offset, stamp, row in zip(offsets, stamps, rows, strict=True):
                out[(p, offset)] = {"row": row, "ts": stamp // 1000}
    return out


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.name)
def test_a_kafka_client_produces_and_consumes_a_table(
    client: KafkaClient, kafka: KafkaTarget, topic: str
) -> None:
    # Rows the SDK appended before are read by the Kafka client too.
    with kafka.gateway.client() as c:
        c.append(topic, [{"id": 1, "name": "sdk", "price": 1.5, "ok": True}])
    values = [
        (
            i % 2,
            json.dumps({"id": 100 + i, "name": f"n{i}", "price": i / 4, "ok": i % 3 == 0}).encode(),
        )
        for i in range(40)
    ]
    offsets = client.produce(kafka, topic, values)
    if offsets:  # acknowledged offsets are the partition's next ones, in order
        for p in (0, 1):
            mine = [o for (q, _), o in zip(values, offsets, strict=True) if q == p]
            assert mine == sorted(mine) and len(set(mine)) == len(mine)

    stored = sdk_records(kafka, topic, 2)
    assert len(stored) == 41
    consumed = client.consume(kafka, topic, [0, 1], len(stored))
    seen = [(m.partition, m.offset) for m in consumed]
    assert len(seen) == len(set(seen)), "a record was read twice"
    assert set(seen) == set(stored), "every record is read, and nothing else"
    for m in consumed:
        want = stored[(m.partition, m.offset)]
        assert m.value is not None and json.loads(m.value) == want["row"]
        assert m.key is not None and json.loads(m.key) == {"id": want["row"]["id"]}
        assert m.timestamp_ms == want["ts"]
    # What the client produced is what is stored, partition by partition, in order.
    for p in (0, 1):
        produced = [json.loads(v) for q, v in values if q == p]
        kept = [stored[k]["row"] for k in sorted(stored) if k[0] == p]
        assert kept[-len(produced) :] == produced
