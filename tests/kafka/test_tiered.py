"""A Kafka consumer reads a table from offset 0 across the tiers: records tiered into
Iceberg (and gone from the hot tier) and hot ones, in one run of offsets, as the SDK's
stitched read returns them (issue 41, Fetch)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.integration.conftest import gateway_env
from tests.kafka.clients import ConfluentKafka
from tests.kafka.conftest import KafkaTarget
from tests.kafka.test_clients import sdk_records
from tests.services import GatewayProcess, free_port

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kind", ["disk", "redis"])
def test_a_consumer_reads_tiered_and_hot_records_in_one_run(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    redis_server = request.getfixturevalue("redis_server") if kind == "redis" else None
    env = {
        **gateway_env(kind, redis_server),
        "TIDEGATE_TIERING__INTERVAL_S": "0.5",
        "TIDEGATE_TIERING__HOT_RETENTION_S": "0",  # tiered records leave the hot tier
        "TIDEGATE_KAFKA__PORT": str(free_port()),
    }
    gw = GatewayProcess(tmp_path / "gw", env).start()
    try:
        assert gw.api_key is not None
        target = KafkaTarget(gw, f"127.0.0.1:{gw.kafka_port}", gw.tenant, gw.api_key)
        topic = "lake.events"
        with gw.client() as c:
            c.create_table(topic, {"n": "int64", "s": "string"}, partitions=1)
        client = ConfluentKafka()
        first = [(0, json.dumps({"n": i, "s": f"cold{i}"}).encode()) for i in range(10)]
        assert client.produce(target, topic, first) == list(range(10))
        deadline = time.monotonic() + 60
        with gw.client() as c:
            while c.describe_table(topic).partition_info[0].tiered_watermark < 10:
                assert time.monotonic() < deadline, gw.log()
                time.sleep(0.2)
        later = [(0, json.dumps({"n": i, "s": f"hot{i}"}).encode()) for i in range(10, 15)]
        assert client.produce(target, topic, later) == list(range(10, 15))

        # A read from offset 0 now takes offsets 0..9 from the Iceberg table.
        with gw.http_client() as h:
            read = h.get("/v1/tables/lake/events/partitions/0/records", params={"offset": 0})
            assert int(read.headers["Tidegate-Tiered-Watermark"]) >= 10

        stored = sdk_records(target, topic, 1)
        consumed = client.consume(target, topic, [0], 15)
        assert [m.offset for m in consumed] == list(range(15))
        for m in consumed:
            assert m.value is not None
            assert json.loads(m.value) == stored[(0, m.offset)]["row"]
            assert m.timestamp_ms == stored[(0, m.offset)]["ts"]
        assert [json.loads(m.value or b"")["s"] for m in consumed][9:11] == ["cold9", "hot10"]
    finally:
        gw.stop()
