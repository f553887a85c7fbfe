"""A real gateway process per hot tier with its Kafka listener, and the Kafka clients
(nobody here wrote them) the tests drive it with."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.conftest import gateway_env
from tests.kafka.members import Member
from tests.services import GatewayProcess, free_port


@dataclass(frozen=True)
class KafkaTarget:
    """Where and as whom a Kafka client connects."""

    gateway: GatewayProcess
    bootstrap: str
    tenant: str
    key: str

    def as_tenant(self, tenant: str, key: str) -> KafkaTarget:
        return KafkaTarget(self.gateway, self.bootstrap, tenant, key)


@pytest.fixture(scope="session", params=["disk", "redis"])
def kafka_gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    kind = str(request.param)
    redis_server = request.getfixturevalue("redis_server") if kind == "redis" else None
    env = {
        **gateway_env(kind, redis_server),
        "TIDEGATE_TIERING__ENABLED": "false",
        # Connections that never authenticate are closed after this long.
        "TIDEGATE_SERVER__HEADER_TIMEOUT_S": "2",
        "TIDEGATE_KAFKA__PORT": str(free_port()),
        # KIP-848 members of a killed consumer leave within seconds (Kafka's 45 s default).
        "TIDEGATE_KAFKA__CONSUMER_SESSION_TIMEOUT_MS": "6000",
        "TIDEGATE_KAFKA__CONSUMER_HEARTBEAT_INTERVAL_MS": "500",
    }
    proc = GatewayProcess(tmp_path_factory.mktemp(f"kafka-{kind}"), env)
    proc.kind = kind  # type: ignore[attr-defined]
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def kafka(kafka_gateway: GatewayProcess) -> KafkaTarget:
    assert kafka_gateway.api_key is not None
    return KafkaTarget(
        kafka_gateway,
        f"127.0.0.1:{kafka_gateway.kafka_port}",
        kafka_gateway.tenant,
        kafka_gateway.api_key,
    )


@pytest.fixture
def other_tenant(kafka: KafkaTarget) -> KafkaTarget:
    """A second tenant of the same gateway, with a key of its own."""
    tenant = f"t{secrets.token_hex(6)}"
    with kafka.gateway.admin() as admin:
        admin.create_tenant(tenant)
        key = admin.issue_key(tenant)[1]
    return kafka.as_tenant(tenant, key)


@pytest.fixture
def theirs(kafka: KafkaTarget, other_tenant: KafkaTarget) -> str:
    """A one-partition table of ``other_tenant`` holding one record (``{"id": 1}``)."""
    name = f"b{secrets.token_hex(5)}.secret"
    with kafka.gateway.client(api_key=other_tenant.key) as b:
        b.create_table(name, {"id": "int64"}, partitions=1)
        b.append(name, [{"id": 1}])
    return name


@pytest.fixture
def topic(kafka: KafkaTarget) -> str:
    """A new two-partition table of ``kafka``'s tenant, as a Kafka topic name."""
    name = f"k{secrets.token_hex(5)}.events"
    with kafka.gateway.client() as c:
        c.create_table(
            name,
            {"id": "int64", "name": "string", "price": "float64", "ok": "bool"},
            partitions=2,
            key_columns=["id"],
        )
    return name


@pytest.fixture
def members() -> Iterator[list[Member]]:
    """The group members a test starts (tests/kafka/members.py), killed if left running."""
    started: list[Member] = []
    yield started
    for m in started:
        if m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait()


@pytest.fixture(params=["disk", "redis"])
def killable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GatewayProcess]:
    """A gateway of its own (it is killed), on each hot tier."""
    kind = str(request.param)
    redis_server = request.getfixturevalue("redis_server") if kind == "redis" else None
    env = {
        **gateway_env(kind, redis_server),
        "TIDEGATE_TIERING__ENABLED": "false",
        # Fixed across the kills: the producer reconnects to the same address.
        "TIDEGATE_KAFKA__PORT": str(free_port()),
        "TIDEGATE_KAFKA__CONSUMER_SESSION_TIMEOUT_MS": "6000",
        "TIDEGATE_KAFKA__CONSUMER_HEARTBEAT_INTERVAL_MS": "500",
    }
    gw = GatewayProcess(tmp_path / "gw", env)
    try:
        gw.start()
        yield gw
    finally:
        gw.stop()
