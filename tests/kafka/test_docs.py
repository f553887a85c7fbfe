"""docs/kafka.md, run as its reader runs it: each block in page order against a gateway,
the tenant's name and key in the environment, its addresses replaced by the gateway's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.docs_runner import blocks
from tests.services import REPO_ROOT, GatewayProcess

pytestmark = pytest.mark.integration

PAGE = REPO_ROOT / "docs" / "kafka.md"


@pytest.mark.parametrize("kafka_gateway", ["disk"], indirect=True)
def test_the_kafka_page_runs(kafka_gateway: GatewayProcess, tmp_path: Path) -> None:
    found = blocks(PAGE)
    assert [b.heading for b in found] == [
        "A table to use",
        "confluent-kafka (librdkafka)",
        "A consumer group (group.protocol=consumer)",
        "kafka-python",
        "aiokafka",
        "kcat",
        "Admin clients",
    ]
    env = {
        **os.environ,
        "TIDEGATE_TENANT": kafka_gateway.tenant,
        "TIDEGATE_API_KEY": str(kafka_gateway.api_key),
    }
    printed: list[str] = []
    for n, block in enumerate(found):
        text = block.text.replace("127.0.0.1:9092", f"127.0.0.1:{kafka_gateway.kafka_port}")
        text = text.replace("127.0.0.1:50051", kafka_gateway.grpc_target)
        if block.lang == "python":
            script = tmp_path / f"block{n}.py"
            script.write_text(text)
            command = [sys.executable, str(script)]
        else:
            assert block.lang == "sh"
            command = ["bash", "-euc", text]
        ran = subprocess.run(
            command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
        )
        assert ran.returncode == 0, f"{block.heading}:\n{ran.stdout}\n{ran.stderr}"
        printed.extend(ran.stdout.splitlines())
    assert "confluent-kafka read 3" in printed
    assert "consumer group read 3" in printed
    assert "kafka-python stored at offset True" in printed
    assert "kafka-python read True" in printed
    assert "aiokafka stored in partition True" in printed
    assert "aiokafka read True" in printed
    assert "retention.ms is 604800000" in printed
    assert "key columns are id" in printed
    assert "cluster tidegate brokers 1" in printed
    # kcat listed the topic, produced one record and read back the six of the page.
    assert any('topic "shop.orders" with 2 partitions' in line for line in printed)
    read = [line for line in printed if line[:2] in ("0 ", "1 ")]
    assert len(read) == 6
    assert any(
        line.startswith("0 ") and line.endswith('{"id":30} {"id":30,"item":"cap","amount":7.0}')
        for line in read
    )
